package idem_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// rawExchange sends exactly these request bytes to addr and returns the raw
// value of the response's Location field (the bytes on the wire), its
// status, and whether it was marked a replay.
func rawExchange(t *testing.T, addr, target string, headers []string, body string) (status int, location string, replayed bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", target, addr, len(body))
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	// net/http keeps header bytes as they came, obs-text (>= 0x80) included.
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode, res.Header.Get("Location"), res.Header.Get(idemhttp.HeaderReplayed) == "true"
}

// Response header values are stored and replayed as the spec's Worker
// stores and replays them, so a row replays byte for byte the same
// whichever side wrote it and whichever side replays it, including values
// with bytes >= 0x80. workerd decodes header bytes as UTF-8 (each
// ill-formed sequence one U+FFFD, the WHATWG decoder) and sends values as
// UTF-8: a value that is valid UTF-8 survives exactly; a Latin-1 byte such
// as 0xE9 does not, on either side.
//
// For each value, a Worker running the spec's handleIdempotentMutation
// (conformance/spec.mjs) writes one key and the middleware another, on one
// workerd D1 database; each side then replays both keys. Every replay must
// carry the same Location bytes, and both rows the same response_headers.
func TestReplayedHeadersAgreeWithSpecWorker(t *testing.T) {
	w := d1test.Workerd(t)
	db := w.NewDatabase(t)
	c := db.Client(t)
	d1test.ApplySchema(t, c)
	l, err := idem.New(c, idem.Config{Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	goSrv := httptest.NewServer(idemhttp.Must(l, idemhttp.Options{
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Spec-Principal"), nil },
	})(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Location", r.Header.Get("X-Spec-Set-Location"))
		rw.WriteHeader(http.StatusCreated)
		io.WriteString(rw, "created")
	})))
	defer goSrv.Close()
	gu, _ := url.Parse(goSrv.URL)
	wu, _ := url.Parse(w.HarnessURL)
	const target = "/v1/orders?x=1"
	worker := func(key, location, status string) (int, string) {
		st, loc, _ := rawExchange(t, wu.Host, "/__spec/mutate/"+db.ID+target,
			[]string{"Idempotency-Key: " + key, "X-Spec-Principal: acct", "X-Spec-Set-Location: " + location, "X-Spec-Status: " + status, "X-Spec-Body: created"}, `{"a":1}`)
		return st, loc
	}
	goSide := func(key, location string) (int, string, bool) {
		return rawExchange(t, gu.Host, target, []string{"Idempotency-Key: " + key, "X-Spec-Principal: acct", "X-Spec-Set-Location: " + location}, `{"a":1}`)
	}
	stored := func(key string) string {
		res, err := c.Query(bg, "SELECT response_headers FROM idempotency_keys WHERE key = ?", key)
		if err != nil || len(res.Rows) != 1 {
			t.Fatalf("%s: %v %v", key, res, err)
		}
		s, _ := res.Rows[0][0].Text()
		return s
	}

	for i, v := range []string{
		"/caf\xc3\xa9",                   // é in UTF-8
		"/\xe2\x82\xac/\xf0\x9f\x98\x80", // € and an emoji: code points above U+00FF
		"/caf\xe9",                       // é in Latin-1: not UTF-8
		"/a\xe9\xe9b",                    // two ill-formed bytes: two U+FFFD
		"/a\xe2\x82x",                    // a truncated sequence: one U+FFFD
		"/\xed\xa0\x80",                  // an encoded surrogate: three U+FFFD
		"/\xc0\xaf\xf4\x90",              // overlong and out of range
	} {
		t.Run(fmt.Sprintf("%q", v), func(t *testing.T) {
			wk, gk := fmt.Sprint("worker-", i), fmt.Sprint("go-", i)
			// The Worker writes; its own answer is the reference.
			st, want := worker(wk, v, "201")
			if st != 201 {
				t.Fatalf("worker: %d", st)
			}
			// The middleware writes the same response under another key.
			if st, _, replayed := goSide(gk, v); st != 201 || replayed {
				t.Fatalf("go: %d", st)
			}
			if ws, gs := stored(wk), stored(gk); ws != gs {
				t.Errorf("stored response_headers differ:\n worker %q\n go     %q", ws, gs)
			}
			for _, key := range []string{wk, gk} {
				// Replays must not execute: a different X-Spec-Status would show.
				if st, loc := worker(key, "/changed", "299"); st != 201 || loc != want {
					t.Errorf("worker replay of %s: %d Location %q, want %q", key, st, loc, want)
				}
				if st, loc, replayed := goSide(key, "/changed"); st != 201 || !replayed || loc != want {
					t.Errorf("go replay of %s: %d replayed=%v Location %q, want %q", key, st, replayed, loc, want)
				}
			}
			if want != idem.DecodeUTF8(v) {
				t.Errorf("the Worker sends %q for %q; idem decodes it to %q", want, v, idem.DecodeUTF8(v))
			}
		})
	}
}
