package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersapi"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/embedded"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "play the idempotency story against the example orders API on the embedded d1local",
		Description: `Starts d1local in process, applies the ledger schema, serves the example orders
API (examples/orders) on a loopback port, and plays a scripted client against it:
a first request, byte-identical replays, 50 concurrent duplicates, a reused key,
a retry during a slow request, and a takeover after an owner crashes. Every
invariant is checked; the command exits 1 if any breaks. It ends by showing the
ledger rows. No Cloudflare account is needed.`,
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "ttl", Value: 2 * time.Second, Usage: "pending TTL, shortened for the demo (the spec's default is 30s)"},
			&cli.StringFlag{Name: "dir", Usage: "keep the demo database under `DIR` (default: in memory)"},
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("demo takes no arguments")
			}
			if c.Duration("ttl") < 500*time.Millisecond {
				return usagef("--ttl %v is too short for the story; use at least 500ms", c.Duration("ttl"))
			}
			return runDemo(c.Context, c.App.Writer, c.Duration("ttl"), c.String("dir"))
		},
	}
}

// demo is the scripted client and its findings.
type demo struct {
	out      io.Writer
	base     string
	client   *http.Client
	db       *d1client.Client
	rows     [][]string
	failures []string
}

type demoReply struct {
	status int
	header http.Header
	body   []byte
}

const demoToken = "tok_demo_alice"

func (d *demo) post(ctx context.Context, key, body string, extra ...string) (demoReply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.base+"/v1/orders", strings.NewReader(body))
	if err != nil {
		return demoReply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+demoToken)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	res, err := d.client.Do(req)
	if err != nil {
		return demoReply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return demoReply{status: res.StatusCode, header: res.Header, body: b}, err
}

// step records one line of the story and whether its invariant held.
func (d *demo) step(scene, request, answer string, ok bool, invariant string) {
	mark := "ok"
	if !ok {
		mark = "BROKEN"
		d.failures = append(d.failures, scene+": "+invariant)
	}
	d.rows = append(d.rows, []string{fmt.Sprint(len(d.rows) + 1), scene, request, answer, mark + "  " + invariant})
}

func (r demoReply) summary() string {
	s := fmt.Sprintf("%d", r.status)
	if r.header.Get(idem.HeaderReplayed) == "true" {
		s += " replayed"
	}
	if code := errorCode(r.body); code != "" {
		s += " " + code
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		s += " Retry-After: " + ra
	}
	return s
}

func errorCode(body []byte) string {
	if i := bytes.Index(body, []byte(`"error":"`)); i >= 0 {
		rest := body[i+9:]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			return string(rest[:j])
		}
	}
	return ""
}

func (d *demo) orders(ctx context.Context, key string) (int64, error) {
	res, err := d.db.Query(ctx, "SELECT count(*) FROM orders WHERE idempotency_key = ?", key)
	if err != nil {
		return 0, err
	}
	n, _ := res.Rows[0][0].Int64()
	return n, nil
}

func runDemo(ctx context.Context, out io.Writer, ttl time.Duration, dir string) error {
	start := time.Now()
	srv, err := embedded.Start(d1local.Config{Dir: dir}, "")
	if err != nil {
		return err
	}
	defer srv.Close()
	db, err := srv.Client("demo")
	if err != nil {
		return err
	}
	if err := ordersapi.EnsureSchema(ctx, db); err != nil {
		return err
	}
	// The demo stages a crashed owner and a fenced-out completion on
	// purpose; the ledger's log lines about them would only clutter its
	// output.
	ledger, err := idem.New(db, idem.Config{TTL: ttl, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	api, err := ordersapi.New(ordersapi.Config{Ledger: ledger, DB: db, DelayHeader: "X-Demo-Delay"})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	defer hs.Close()

	d := &demo{out: out, base: "http://" + ln.Addr().String(), db: db,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	fmt.Fprintf(out, "d1idem demo: orders API on %s, ledger on the embedded d1local (%s), TTL %v\n\n", d.base, srv.URL, ttl)

	if err := d.play(ctx, ledger, ttl); err != nil {
		return err
	}
	if err := printTable(out, []string{"#", "SCENE", "REQUEST", "ANSWER", "INVARIANT"}, d.rows); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nLedger rows (idempotency_keys):")
	if err := d.printLedger(ctx, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d steps in %v; D1 calls: %d\n", len(d.rows), time.Since(start).Round(time.Millisecond), db.Stats().Calls)
	if len(d.failures) > 0 {
		return fmt.Errorf("%d invariant(s) broken: %s", len(d.failures), strings.Join(d.failures, "; "))
	}
	fmt.Fprintln(out, "All invariants held.")
	return nil
}

func (d *demo) play(ctx context.Context, ledger *idem.Ledger, ttl time.Duration) error {
	const order = `{"sku":"tea","qty":2}`

	// 1. The first request creates the order.
	first, err := d.post(ctx, "order-1", order)
	if err != nil {
		return err
	}
	n, err := d.orders(ctx, "order-1")
	if err != nil {
		return err
	}
	d.step("first request", "POST order-1", first.summary(), first.status == 201 && n == 1, "201 Created, one order")

	// 2. Sequential retries replay it byte for byte.
	for i := 1; i <= 3; i++ {
		r, err := d.post(ctx, "order-1", order)
		if err != nil {
			return err
		}
		same := r.status == first.status && bytes.Equal(r.body, first.body) && r.header.Get("Location") == first.header.Get("Location")
		d.step("retry", fmt.Sprintf("POST order-1 (retry %d)", i), r.summary(), same && r.header.Get(idem.HeaderReplayed) == "true",
			"byte-identical replay, Idempotent-Replayed: true")
	}
	if n, err = d.orders(ctx, "order-1"); err != nil {
		return err
	}
	d.step("retry", "orders for order-1", fmt.Sprintf("%d order", n), n == 1, "still exactly one order")

	// 3. 50 concurrent duplicates create exactly one order.
	var wg sync.WaitGroup
	replies := make([]demoReply, 50)
	errs := make([]error, 50)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i], errs[i] = d.post(ctx, "order-2", `{"sku":"coffee","qty":1}`)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	created, replayed, inProgress, other := 0, 0, 0, 0
	var body []byte
	consistent := true
	for _, r := range replies {
		switch {
		case r.status == 201:
			if r.header.Get(idem.HeaderReplayed) == "true" {
				replayed++
			} else {
				created++
			}
			if body != nil && !bytes.Equal(body, r.body) {
				consistent = false
			}
			body = r.body
		case r.status == 409 && errorCode(r.body) == idem.CodeKeyInProgress:
			inProgress++
		default:
			other++
		}
	}
	if n, err = d.orders(ctx, "order-2"); err != nil {
		return err
	}
	d.step("50 concurrent duplicates", "POST order-2 x50 at once",
		fmt.Sprintf("%d created, %d replayed, %d in progress", created, replayed, inProgress),
		n == 1 && created == 1 && other == 0 && consistent && created+replayed+inProgress == 50,
		fmt.Sprintf("exactly one order (found %d), one 201 created", n))

	// 4. The same key with another body is refused.
	r, err := d.post(ctx, "order-1", `{"sku":"tea","qty":3}`)
	if err != nil {
		return err
	}
	d.step("reused key", "POST order-1, qty 3", r.summary(), r.status == 409 && errorCode(r.body) == idem.CodeKeyReused, "409 idempotency_key_reused, nothing executed")

	// 5. A retry during a slow request gets 409 in progress.
	slowDone := make(chan demoReply, 1)
	slowErr := make(chan error, 1)
	go func() {
		r, err := d.post(ctx, "order-3", `{"sku":"cake","qty":1}`, "X-Demo-Delay", (ttl * 3 / 4).String())
		slowErr <- err
		slowDone <- r
	}()
	time.Sleep(ttl / 5)
	r, err = d.post(ctx, "order-3", `{"sku":"cake","qty":1}`)
	if err != nil {
		return err
	}
	d.step("slow request", "POST order-3 while it runs", r.summary(),
		r.status == 409 && errorCode(r.body) == idem.CodeKeyInProgress && r.header.Get("Retry-After") != "", "409 in progress with Retry-After")
	if err := <-slowErr; err != nil {
		return err
	}
	slow := <-slowDone
	d.step("slow request", "the slow POST order-3 finishes", slow.summary(), slow.status == 201, "201 Created")

	// 6. An owner crashes; after the TTL the key is taken over.
	crashBody := `{"sku":"pie","qty":4}`
	fp, err := idem.Fingerprint(http.MethodPost, "/v1/orders", http.Header{"Content-Type": {"application/json"}},
		ledger.Config().FingerprintHeaders, strings.NewReader(crashBody))
	if err != nil {
		return err
	}
	crashed, err := ledger.Begin(ctx, demoToken, "order-4", fp)
	if err != nil {
		return err
	}
	d.step("owner crashes", "instance B claims order-4, then dies", crashed.Outcome.String(),
		crashed.Outcome == idem.Execute, "claimed; no completion, no heartbeat")
	r, err = d.post(ctx, "order-4", crashBody)
	if err != nil {
		return err
	}
	d.step("owner crashes", "POST order-4 before the TTL", r.summary(), r.status == 409 && errorCode(r.body) == idem.CodeKeyInProgress, "409 in progress: the lease is still held")
	time.Sleep(ttl + 100*time.Millisecond)
	r, err = d.post(ctx, "order-4", crashBody)
	if err != nil {
		return err
	}
	if n, err = d.orders(ctx, "order-4"); err != nil {
		return err
	}
	d.step("owner crashes", fmt.Sprintf("POST order-4 after the TTL (%v)", ttl), r.summary(), r.status == 201 && n == 1, "taken over at generation 2: one order")
	c, err := ledger.Complete(ctx, crashed.Reservation, idem.Response{Status: 201, Body: []byte(`{"late":true}`)})
	if err != nil {
		return err
	}
	d.step("owner crashes", "instance B's late completion", fmt.Sprintf("stored=%v", c.Stored), !c.Stored, "fenced out by the generation")

	// 7. Protection is not optional.
	r, err = d.post(ctx, "", order)
	if err != nil {
		return err
	}
	d.step("no key", "POST without Idempotency-Key", r.summary(), r.status == 400 && errorCode(r.body) == idem.CodeKeyRequired, "400 idempotency_key_required")
	return nil
}

func (d *demo) printLedger(ctx context.Context, out io.Writer) error {
	res, err := d.db.Query(ctx, `SELECT key, status, generation, response_status, length(response_body), response_headers, updated_at - created_at
FROM idempotency_keys ORDER BY created_at, key`)
	if err != nil {
		return err
	}
	var rows [][]string
	for _, r := range res.Rows {
		row := make([]string, len(r))
		for i, v := range r {
			row[i] = v.String()
		}
		rows = append(rows, row)
	}
	return printTable(out, []string{"KEY", "STATUS", "GEN", "RESPONSE", "BODY BYTES", "REPLAYED HEADERS", "UPDATED-CREATED MS"}, rows)
}
