package faults

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// faultProxy applies d1local's faults to the calls it forwards to another
// D1 REST server: the bridge in workerd, which cannot inject them itself.
// It follows d1local.Fault's rules: Latency first; RateLimit answers 429/971
// without forwarding; LoseResponse forwards, waits for the answer (the call
// has committed) and drops the connection; Overloaded, Internal and
// BadGateway answer their error without forwarding, or after the forwarded
// call has committed with AfterCommit.
//
// A call the proxy fails to forward (the bridge's connection dropped under
// load) is answered 500 like an injected internal error, and reported to
// failed: to the client it is a fault like any other.
type faultProxy struct {
	target string
	hc     *http.Client
	hook   d1local.FaultFunc
	failed func(d1local.Request)
	seq    atomic.Int64
}

// bridgeWithFaults returns the workerd backend (the bridge) reached through
// a faultProxy consulting hook and reporting forwarding failures to failed.
func bridgeWithFaults(t testing.TB, hook d1local.FaultFunc, failed func(d1local.Request)) *d1test.Backend {
	t.Helper()
	b := d1test.Workerd(t)
	srv := httptest.NewServer(&faultProxy{target: b.BaseURL, hc: b.HTTPClient, hook: hook, failed: failed})
	t.Cleanup(srv.Close)
	fb := *b
	fb.BaseURL = srv.URL
	return &fb
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		proxyError(w, http.StatusBadRequest, 7400, "reading the body: "+err.Error())
		return
	}
	var fault d1local.Fault
	req, isCall := parseCall(r, body)
	if isCall {
		req.Seq = p.seq.Add(1)
		fault = p.hook(req)
	}
	if fault.Latency > 0 {
		select {
		case <-time.After(fault.Latency):
		case <-r.Context().Done():
			proxyError(w, http.StatusInternalServerError, 7500, "internal error; reference = proxy (latency fault cancelled)")
			return
		}
	}
	if fault.RateLimit {
		retry := fault.RetryAfter
		if retry <= 0 {
			retry = 300 * time.Second
		}
		w.Header().Set("Retry-After", fmt.Sprint(int64(math.Ceil(retry.Seconds()))))
		proxyError(w, http.StatusTooManyRequests, 971, "Please wait and consider throttling your request speed")
		return
	}
	errorFault := fault.Overloaded || fault.Internal || fault.BadGateway
	if errorFault && !fault.AfterCommit && !fault.LoseResponse {
		writeProxyFault(w, fault)
		return
	}
	res, err := p.forward(r, body)
	if err != nil {
		if isCall && p.failed != nil {
			p.failed(req)
		}
		proxyError(w, http.StatusInternalServerError, 7500, "internal error; reference = proxy ("+err.Error()+")")
		return
	}
	if fault.LoseResponse {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if errorFault {
		writeProxyFault(w, fault)
		return
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// forward sends the call on and reads the whole answer.
func (p *faultProxy) forward(r *http.Request, body []byte) (*d1test.Response, error) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "Content-Type"} {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	res, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &d1test.Response{Status: res.StatusCode, Header: res.Header, Body: data}, nil
}

// parseCall describes a well-formed query or raw call for the fault hook.
func parseCall(r *http.Request, body []byte) (d1local.Request, bool) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/client/v4"), "/")
	if r.Method != http.MethodPost || len(parts) != 7 || parts[1] != "accounts" || parts[3] != "d1" || parts[4] != "database" ||
		(parts[6] != "query" && parts[6] != "raw") {
		return d1local.Request{}, false
	}
	var q struct {
		SQL   *string `json:"sql"`
		Batch []struct {
			SQL string `json:"sql"`
		} `json:"batch"`
	}
	if json.Unmarshal(body, &q) != nil {
		return d1local.Request{}, false
	}
	req := d1local.Request{AccountID: parts[2], DatabaseID: parts[5], Endpoint: parts[6]}
	switch {
	case q.Batch != nil:
		for _, s := range q.Batch {
			req.Statements = append(req.Statements, s.SQL)
		}
	case q.SQL != nil:
		req.Statements = []string{*q.SQL}
	default:
		return d1local.Request{}, false
	}
	return req, true
}

// writeProxyFault answers as d1local does for Overloaded, Internal and
// BadGateway.
func writeProxyFault(w http.ResponseWriter, f d1local.Fault) {
	switch {
	case f.Overloaded:
		proxyError(w, http.StatusTooManyRequests, 7500, "D1 DB is overloaded. Requests queued for too long.")
	case f.Internal:
		proxyError(w, http.StatusInternalServerError, 7500, "internal error; reference = "+strings.ToLower(rand.Text()))
	default:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>cloudflare</center>\n</body>\n</html>\n")
	}
}

// proxyError writes a Cloudflare error envelope.
func proxyError(w http.ResponseWriter, status, code int, message string) {
	result := "null"
	if code == 7500 {
		result = "[]"
	}
	msg, _ := json.Marshal(message)
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"result":%s,"success":false,"errors":[{"code":%d,"message":%s}],"messages":[]}`, result, code, msg)
}

// The randomized run with every D1 call going to the bridge in workerd
// (through a proxy injecting the same faults d1local would): the ledger's
// invariants hold against the real D1 binding behind the product's Worker,
// with the same coverage demanded as on d1local. It is smaller than the
// d1local run, the Node and workerd processes sharing the machine.
// -faults.long adds the long form, rounds of fresh keys for 10 minutes
// (-faults.duration).
func TestRandomizedFaultsBridge(t *testing.T) {
	t.Parallel()
	s := seed(t)
	t.Logf("seed %d (rerun with -faults.seed=%d or FAULTS_SEED=%d)", s, s, s)
	base := runConfig{Seed: s, Clients: 12, Keys: 16, TTL: 600 * time.Millisecond, OnBridge: true}.withAll()
	t.Run("short", func(t *testing.T) {
		cfg := base
		start := time.Now()
		o, run := runRandomized(t, cfg)
		st, _ := verify(t, cfg, o, run, time.Since(start))
		requireCoverage(t, cfg, st)
	})
	t.Run("long", func(t *testing.T) { runLong(t, base) })
}
