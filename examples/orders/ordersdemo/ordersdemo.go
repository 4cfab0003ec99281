// Package ordersdemo plays a client against the orders API (package
// ordersapi) and checks, step by step, what Idempotency-Key protection
// promises: a retry is answered with the stored response and runs nothing
// again, 50 copies of one request create one order, a key reused for
// another request is refused, a request slower than the TTL keeps its key
// while its server renews it, and a key whose server crashed
// mid-request is taken over by the retry, the dead server's late answer
// refused. It is the story `d1idem demo` tells; it reads the API's orders
// table and the ledger, and stages the crash through the ledger itself.
package ordersdemo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// Token is the story's client's bearer token, and so its principal.
const Token = "tok_demo_alice"

// MaxTTL is the longest TTL the story takes: it waits it out three times.
const MaxTTL = 5 * time.Minute

// Config is what a Story plays against.
type Config struct {
	// BaseURL is the orders API's URL.
	BaseURL string
	// DB is the API's database, where the story counts orders, and
	// Ledger the API's ledger, whose TTL the story waits out.
	DB     *d1client.Client
	Ledger *idem.Ledger
	// StallHeader is the API's ordersapi.Config.DelayHeader: the slow
	// request stalls by it.
	StallHeader string
	// Out receives each step as it happens.
	Out io.Writer
}

// Story is one play of the story: each scene sends requests, checks what
// the ledger promises, and shows each step as it happens.
type Story struct {
	cfg    Config
	out    io.Writer
	ttl    time.Duration
	run    string // makes this play's keys unique in a kept database
	client *http.Client
	start  time.Time
	steps  int
	broken []string
}

// New returns a Story of cfg.
func New(cfg Config) *Story {
	var b [2]byte
	_, _ = rand.Read(b[:])
	ttl := cfg.Ledger.Config().TTL
	return &Story{cfg: cfg, out: cfg.Out, ttl: ttl, run: hex.EncodeToString(b[:]), start: time.Now(),
		client: &http.Client{Timeout: clientTimeout(ttl), Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// Broken lists the promises that did not hold.
func (s *Story) Broken() []string { return s.broken }

// Play runs the scenes in order; an error is the story's own failure (the
// API did not answer), not a broken promise (see Broken).
func (s *Story) Play(ctx context.Context) error {
	for _, scene := range []func(context.Context) error{
		s.firstRequest, s.retries, s.concurrentCopies, s.reusedKey, s.slowRequest, s.crashedServer, s.noKey,
	} {
		if err := scene(ctx); err != nil {
			return err
		}
	}
	return nil
}

// key is the name of one of the story's keys in this run: "order-1.3fa2".
func (s *Story) key(name string) string { return name + "." + s.run }

// check shows a step, at once, and whether the promise held.
func (s *Story) check(what, got string, held bool, promise string) {
	mark := "ok: "
	if !held {
		mark = "BROKEN: "
		s.broken = append(s.broken, what+": "+promise)
	}
	s.steps++
	fmt.Fprintf(s.out, "%2d. %s\n      answer: %s\n      %s\n", s.steps, what, got, mark+promise)
}

// reply is an answer of the demo API.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// words describes a reply in plain words: "409 Conflict (idempotency_key_in_progress), retry in 2s".
func (r reply) words() string {
	s := fmt.Sprintf("%d %s", r.status, http.StatusText(r.status))
	if r.replayed() {
		s += ", a replay"
	}
	if code := r.errorCode(); code != "" {
		s += " (" + code + ")"
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		s += ", Retry-After: " + ra
	}
	return s
}

func (r reply) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// errorCode is the "error" of a JSON error body, or "".
func (r reply) errorCode() string {
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error
}

// request is a POST /v1/orders of the demo's client; key "" sends none.
func (s *Story) request(ctx context.Context, key, body string, extra http.Header) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.BaseURL+"/v1/orders", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+Token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	for name, values := range extra {
		req.Header[name] = values
	}
	return req, nil
}

func (s *Story) send(req *http.Request) (reply, error) {
	res, err := s.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: b}, err
}

func (s *Story) post(ctx context.Context, key, body string, extra http.Header) (reply, error) {
	req, err := s.request(ctx, key, body, extra)
	if err != nil {
		return reply{}, err
	}
	return s.send(req)
}

// attempt sends a POST and counts the key's orders after its answer.
func (s *Story) attempt(ctx context.Context, key, body string) (reply, int64, error) {
	r, err := s.post(ctx, key, body, nil)
	if err != nil {
		return r, 0, err
	}
	n, err := s.orders(ctx, key)
	return r, n, err
}

// orders counts the orders the orders API created for a key.
func (s *Story) orders(ctx context.Context, key string) (int64, error) {
	res, err := s.cfg.DB.Query(ctx, "SELECT count(*) FROM orders WHERE idempotency_key = ?", key)
	if err != nil {
		return 0, err
	}
	n, _ := res.Rows[0][0].Int64()
	return n, nil
}

const teaOrder = `{"sku":"tea","qty":2}`

// firstRequest shows one real exchange as it travels, then checks that it
// created one order.
func (s *Story) firstRequest(ctx context.Context) error {
	key := s.key("order-1")
	req, err := s.request(ctx, key, teaOrder, nil)
	if err != nil {
		return err
	}
	dump, err := httputil.DumpRequestOut(req, true)
	if err != nil {
		return err
	}
	res, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	resDump, err := httputil.DumpResponse(res, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "The first request and its answer, as they travel (curl -v shows them the same way):\n\n%s%s\n",
		exchangeLines("> ", dump), exchangeLines("< ", resDump))
	n, err := s.orders(ctx, key)
	if err != nil {
		return err
	}
	s.check("The client sends an order, POST /v1/orders with Idempotency-Key "+key, fmt.Sprintf("%d %s", res.StatusCode, http.StatusText(res.StatusCode)),
		res.StatusCode == http.StatusCreated && n == 1, "one order created")
	return nil
}

// exchangeLines prefixes each line of an HTTP message, as curl -v does.
func exchangeLines(prefix string, msg []byte) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(strings.ReplaceAll(string(msg), "\r\n", "\n"), "\n"), "\n") {
		b.WriteString(strings.TrimRight(prefix+line, " ") + "\n")
	}
	return b.String()
}

// retries sends the first request again three times: each gets the stored
// answer (status, body, Content-Type and Location: what a replay carries),
// and nothing runs again.
func (s *Story) retries(ctx context.Context) error {
	key := s.key("order-1")
	var first reply
	same := true
	for i := range 4 {
		r, err := s.post(ctx, key, teaOrder, nil)
		if err != nil {
			return err
		}
		if i == 0 {
			first = r
		}
		same = same && r.replayed() && r.status == first.status && bytes.Equal(r.body, first.body) &&
			r.header.Get("Location") == first.header.Get("Location")
	}
	n, err := s.orders(ctx, key)
	if err != nil {
		return err
	}
	s.check("It retries the same request, 4 times", first.words()+" (each time)", same && n == 1,
		"the same status, body and Location, marked Idempotent-Replayed; still one order")
	return nil
}

// concurrentCopies sends 50 copies of one request at once: exactly one
// runs.
func (s *Story) concurrentCopies(ctx context.Context) error {
	const copies = 50
	key := s.key("order-2")
	replies, errs := make([]reply, copies), make([]error, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { replies[i], errs[i] = s.post(ctx, key, `{"sku":"coffee","qty":1}`, nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var created, replayed, inProgress int
	for _, r := range replies {
		switch {
		case r.status == http.StatusCreated && r.replayed():
			replayed++
		case r.status == http.StatusCreated:
			created++
		case r.status == http.StatusConflict && r.errorCode() == idemhttp.CodeKeyInProgress:
			inProgress++
		}
	}
	n, err := s.orders(ctx, key)
	if err != nil {
		return err
	}
	s.check(fmt.Sprintf("%d copies of one request (key %s) arrive at once", copies, key),
		fmt.Sprintf("%d created, %d replays, %d told to wait (409 in progress)", created, replayed, inProgress),
		n == 1 && created == 1 && created+replayed+inProgress == copies, "exactly one order; every copy answered")
	return nil
}

// reusedKey sends another request under a key already used: refused.
func (s *Story) reusedKey(ctx context.Context) error {
	key := s.key("order-1")
	r, n, err := s.attempt(ctx, key, `{"sku":"tea","qty":3}`)
	if err != nil {
		return err
	}
	s.check("The client reuses "+key+" for another order (qty 3)", r.words(),
		r.status == http.StatusConflict && r.errorCode() == idemhttp.CodeKeyReused && n == 1, "refused; nothing runs")
	return nil
}

// noKey sends a request without a key: protection is not optional.
func (s *Story) noKey(ctx context.Context) error {
	r, err := s.post(ctx, "", teaOrder, nil)
	if err != nil {
		return err
	}
	s.check("A request without an Idempotency-Key", r.words(),
		r.status == http.StatusBadRequest && r.errorCode() == idemhttp.CodeKeyRequired, "refused: the API requires a key")
	return nil
}

// clientTimeout bounds each of the story's requests: the slowest, the
// slow request, stalls for slowStall.
func clientTimeout(ttl time.Duration) time.Duration {
	return 30*time.Second + 2*ttl
}

// slowStall is how long the slow request's handler stalls: longer than the
// TTL, so that its server must renew the key.
func slowStall(ttl time.Duration) time.Duration { return ttl * 3 / 2 }

// slowRequest sends a request that takes longer than the TTL, and retries
// it while it runs: its server renews the key, so the retry is told to
// wait, and only the slow request creates the order.
func (s *Story) slowRequest(ctx context.Context) error {
	key, stall := s.key("order-3"), slowStall(s.ttl)
	done := make(chan error, 1)
	var slow reply
	go func() {
		var err error
		slow, err = s.post(ctx, key, `{"sku":"cake","qty":1}`, http.Header{s.cfg.StallHeader: {stall.String()}})
		done <- err
	}()
	wait := s.ttl + s.ttl/10
	select {
	case <-time.After(wait):
	case err := <-done:
		return fmt.Errorf("the slow request ended before its retry: %v", err)
	}
	r, err := s.post(ctx, key, `{"sku":"cake","qty":1}`, nil)
	if err != nil {
		return err
	}
	s.check(fmt.Sprintf("A slow request (key %s) takes %s, longer than the TTL; the client retries it after %s", key, duration(stall), duration(wait)),
		r.words(), r.status == http.StatusConflict && r.errorCode() == idemhttp.CodeKeyInProgress && r.header.Get("Retry-After") != "",
		"told to wait: the slow request's server renews its key while it works")
	if err := <-done; err != nil {
		return err
	}
	n, err := s.orders(ctx, key)
	if err != nil {
		return err
	}
	s.check("The slow request finishes", slow.words(), slow.status == http.StatusCreated && n == 1, "one order")
	return nil
}

// crashedServer stages a server that claims a key and dies before it
// answers (through the ledger: the claim, and no answer and no renewal
// after it). The client is told to wait until the TTL has passed; then its
// retry takes the key over, and the dead server's late answer is refused.
func (s *Story) crashedServer(ctx context.Context) error {
	key, body := s.key("order-4"), `{"sku":"pie","qty":4}`
	fp, err := idem.Fingerprint(http.MethodPost, "/v1/orders", http.Header{"Content-Type": {"application/json"}},
		s.cfg.Ledger.Config().FingerprintHeaders, strings.NewReader(body))
	if err != nil {
		return err
	}
	dead, err := s.cfg.Ledger.Begin(ctx, Token, key, fp)
	if err != nil {
		return err
	}
	s.check("Another server takes "+key+" and crashes before it answers", "(no answer)", dead.Outcome == idem.Execute, "the key is held for it")
	r, err := s.post(ctx, key, body, nil)
	if err != nil {
		return err
	}
	s.check("The client retries at once", r.words(), r.status == http.StatusConflict && r.errorCode() == idemhttp.CodeKeyInProgress,
		"told to wait: the key is held until the TTL has passed")
	time.Sleep(s.ttl + s.ttl/10)
	if err := s.takeOver(ctx, key, body); err != nil {
		return err
	}
	late, err := s.cfg.Ledger.Complete(ctx, dead.Reservation, idem.Response{Status: http.StatusCreated, Body: []byte(`{"late":true}`)})
	if err != nil {
		return err
	}
	s.check("The crashed server comes back and tries to store its answer", "-", !late.Stored,
		"refused: the key has moved on to the next generation")
	return nil
}

// takeOver retries a key whose server died, after the TTL: the retry takes
// the key over, one generation on, and creates the one order.
func (s *Story) takeOver(ctx context.Context, key, body string) error {
	r, n, err := s.attempt(ctx, key, body)
	if err != nil {
		return err
	}
	row, err := s.cfg.Ledger.Admin().Get(ctx, Token, key)
	if err != nil {
		return err
	}
	s.check(fmt.Sprintf("After the %s TTL, the client retries", duration(s.ttl)), r.words(),
		r.status == http.StatusCreated && n == 1 && row.Generation == 2, "the retry takes the key over (generation 2): one order")
	return nil
}

// Report writes the ledger's rows of this play, and the time and D1 calls
// it took.
func (s *Story) Report(ctx context.Context) error {
	page, err := s.cfg.Ledger.Admin().List(ctx, idem.ListOptions{Principal: Token, Limit: idem.MaxListLimit})
	if err != nil {
		return err
	}
	var rows [][]string
	for _, k := range page.Keys {
		if strings.HasSuffix(k.Key, "."+s.run) {
			stored := "-"
			if k.ResponseStatus != nil {
				stored = fmt.Sprint(*k.ResponseStatus)
			}
			rows = append(rows, []string{k.Key, string(k.Status), fmt.Sprint(k.Generation), stored})
		}
	}
	fmt.Fprintln(s.out, "\nThe ledger's rows (one per key; a retry is answered from its row; GENERATION counts takeovers):")
	tw := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', 0)
	for _, r := range append([][]string{{"KEY", "STATUS", "GENERATION", "STORED RESPONSE"}}, rows...) {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(s.out, "\n%d steps in %s, %d D1 calls.\n", s.steps, duration(time.Since(s.start)), s.cfg.DB.Stats().Calls)
	return err
}

// duration is a duration for people, as d1idem writes those of the story:
// "850ms", "2s", "1m30s", "5m".
func duration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	return s
}
