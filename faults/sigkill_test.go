package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Environment of the helper process (the test binary re-executed).
const (
	envHelper    = "FAULTS_HELPER" // the helper's mode: "block" or "complete"
	envD1URL     = "FAULTS_D1_URL"
	envD1DB      = "FAULTS_D1_DATABASE"
	envTTL       = "FAULTS_TTL"
	envHeartbeat = "FAULTS_HEARTBEAT"
)

// TestHelperProcess is not a test: it is the owning process of
// TestOwnerKilledWithSIGKILL, run as a real subprocess. It serves the
// middleware with the business handler against the parent's d1local, prints
// "ADDR <url>" when it listens and "MUTATING <exec>" once its handler runs,
// and then, in mode "block", blocks mid-mutation (the business write queued
// on idemhttp.Tx, not committed) until it is killed; in mode "complete", its
// handler returns and its completion travels to D1, where the parent holds
// it until the kill.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("helper process for TestOwnerKilledWithSIGKILL")
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "helper: "+format+"\n", args...)
		os.Exit(3)
	}
	ttl, err1 := time.ParseDuration(os.Getenv(envTTL))
	hb, err2 := time.ParseDuration(os.Getenv(envHeartbeat))
	if err1 != nil || err2 != nil {
		fail("bad TTL or heartbeat: %v %v", err1, err2)
	}
	db, err := d1client.New(d1client.Config{BaseURL: os.Getenv(envD1URL), AccountID: d1test.AccountID,
		DatabaseID: os.Getenv(envD1DB), Budget: budget.Unlimited()})
	if err != nil {
		fail("%v", err)
	}
	l, err := idem.New(db, idem.Config{TTL: ttl, Heartbeat: hb})
	if err != nil {
		fail("%v", err)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	h := &bizHandler{db: db, before: func(ctx context.Context, exec string) {
		say("MUTATING child-%s", exec)
	}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mode == "block" {
			// Queue the business write, announce, and stall mid-mutation.
			tx, _ := idemhttp.TxFromContext(r.Context())
			tx.Add(d1client.Statement{SQL: `INSERT INTO business (principal, key, exec_id, at) VALUES (?, ?, 'child', 0)`,
				Params: []any{"acct", r.Header.Get(idemhttp.HeaderKey)}})
			say("MUTATING child")
			select {}
		}
		h.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("%v", err)
	}
	say("ADDR http://%s", ln.Addr())
	srv := &http.Server{Handler: idemhttp.Must(l, idemhttp.Options{Principal: bearer})(handler), ReadHeaderTimeout: 10 * time.Second}
	_ = srv.Serve(ln)
	os.Exit(0)
}

// child is a running helper process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
	url    string
}

func startChild(t *testing.T, w *world, mode string, ttl, heartbeat time.Duration) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envHelper+"="+mode, envD1URL+"="+w.b.BaseURL, envD1DB+"="+w.dbh.ID,
		envTTL+"="+ttl.String(), envHeartbeat+"="+heartbeat.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only our own child, by its handle; a no-op once it is dead.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	line := c.expect(t, "ADDR ")
	c.url = strings.TrimPrefix(line, "ADDR ")
	return c
}

// expect waits for the child's next line starting with prefix.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("the child exited before printing %q; stderr:\n%s", prefix, c.stderr)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("the child did not print %q in 30 s; stderr:\n%s", prefix, c.stderr)
		}
	}
}

// kill sends SIGKILL to the child and reaps it.
func (c *child) kill(t *testing.T) time.Time {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	err := c.cmd.Wait()
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die of SIGKILL: %v", err)
	}
	return at
}

// The owning process is killed with SIGKILL mid-mutation: a real
// subprocess serves the middleware against this process's d1local, claims
// the key, heartbeats, and dies without a chance to release or complete.
// While it lives, its heartbeats keep the reservation (retries here get 409
// in progress even past the TTL); once it is dead, retries still get 409
// until the TTL has passed since its last heartbeat, then one takes the key
// over at generation 2, and the business write happens exactly once -- the
// dead owner's queued write never lands.
func TestOwnerKilledWithSIGKILL(t *testing.T) {
	t.Parallel()
	// A heartbeat every 250 ms, each with 250 ms to renew, and a lease lost
	// only after 3 s without one: a loaded machine delays heartbeats, but
	// not by twelve in a row.
	const (
		ttl       = 3 * time.Second
		heartbeat = 250 * time.Millisecond
	)
	for _, mode := range []string{"block", "complete"} {
		t.Run(map[string]string{"block": "mid_handler", "complete": "during_round_trip_2"}[mode], func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			completionArrived := make(chan struct{}, 1)
			if mode == "complete" {
				// Hold the child's completion in D1's queue (a latency
				// fault) and tell the test it arrived.
				w.setPolicy(func(_ d1local.Request, c calls) d1local.Fault {
					if c.complete {
						select {
						case completionArrived <- struct{}{}:
						default:
						}
						return d1local.Fault{Latency: 30 * time.Second}
					}
					return d1local.Fault{}
				})
			}
			ch := startChild(t, w, mode, ttl, heartbeat)
			h := &bizHandler{}
			st := w.newStack(idem.Config{TTL: ttl, Heartbeat: heartbeat}, func(db *d1client.Client) http.Handler { h.db = db; return h })
			send := func() answer { return post(bg, st.srv.URL, "acct", "killed", `{"sku":"tea"}`) }

			childAnswer := make(chan answer, 1)
			go func() { childAnswer <- post(bg, ch.url, "acct", "killed", `{"sku":"tea"}`) }()
			ch.expect(t, "MUTATING")
			if mode == "complete" {
				select {
				case <-completionArrived:
				case <-time.After(30 * time.Second):
					t.Fatal("the child's completion never reached D1")
				}
			} else {
				// While the child lives, its heartbeats keep the key: in
				// progress here, even past the TTL.
				end := time.Now().Add(ttl + 500*time.Millisecond)
				for time.Now().Before(end) {
					if a := send(); a.Status != http.StatusConflict || a.code() != idemhttp.CodeKeyInProgress {
						t.Fatalf("while the owner lives: %s", a)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			r, _ := w.row("acct", "killed")
			lastBeat := r.UpdatedAt
			killedAt := ch.kill(t)
			d1Killed := w.d1Now()
			w.setPolicy(nil)
			if a := <-childAnswer; a.Err == nil {
				t.Fatalf("the killed owner answered: %s", a)
			}
			// Right after the kill the key is still in progress: checked when
			// D1's clock shows the retry ended inside the TTL of the last
			// heartbeat seen before the kill.
			a := send()
			if age := w.d1Now() - lastBeat; age > ttl.Milliseconds() {
				t.Logf("the retry after the kill ended %d ms after the last heartbeat, past the TTL: %s", age, a)
			} else if a.Status != http.StatusConflict || a.code() != idemhttp.CodeKeyInProgress {
				t.Fatalf("right after the kill (%d ms after the last heartbeat): %s", age, a)
			}
			as := retryUntilFinal(t, 15*time.Second, send)
			got := as[len(as)-1]
			if got.Status != http.StatusCreated || got.replayed() {
				t.Fatalf("after the kill:\n  %s", summarize(as))
			}
			var takeoverAt int64
			for _, e := range w.events() {
				if e.Kind == "takeover" {
					takeoverAt = e.At
				}
			}
			t.Logf("killed %v after the claim; D1: last heartbeat %d ms before the kill, takeover %d ms after it (TTL %v); %d retries got 409 first",
				killedAt.Sub(time.UnixMilli(r.CreatedAt)).Round(time.Millisecond), d1Killed-lastBeat, takeoverAt-d1Killed, ttl, len(as)-1)
			if takeoverAt-lastBeat < ttl.Milliseconds() {
				t.Errorf("taken over %d ms after the last heartbeat, before the TTL", takeoverAt-lastBeat)
			}
			w.assertOnce(t, "acct", "killed", 2)
			if biz := w.business()[pk{"acct", "killed"}]; len(biz) != 1 || strings.HasPrefix(biz[0].Exec, "child") {
				t.Errorf("business rows %+v", biz)
			}
			if rp := send(); !rp.replayed() || rp.replayable() != got.replayable() {
				t.Errorf("replay %s, want %s", rp, got)
			}
		})
	}
}
