package idemhttp_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

func businessTable(t *testing.T, db *d1client.Client) {
	t.Helper()
	if _, err := db.Query(bg, "CREATE TABLE orders (key TEXT NOT NULL, owner TEXT NOT NULL, UNIQUE (key, owner))"); err != nil {
		t.Fatal(err)
	}
}

func insertOrder(key, owner string) d1client.Statement {
	return d1client.Statement{SQL: "INSERT INTO orders (key, owner) VALUES (?, ?)", Params: []any{key, owner}}
}

func orders(t *testing.T, db *d1client.Client, key string) []string {
	t.Helper()
	res, err := db.Query(bg, "SELECT owner FROM orders WHERE key = ? ORDER BY owner", key)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res.Rows {
		s, _ := r[0].Text()
		out = append(out, s)
	}
	return out
}

// When the handler's own statement fails, nothing is committed: the client
// gets 500 idempotency_mutation_not_committed, and the reservation is
// released so a retry executes again.
func TestTransactionalCompletionHandlerStatementFails(t *testing.T) {
	var attempt int
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		attempt++
		tx, ok := idemhttp.TxFromContext(r.Context())
		if !ok {
			t.Error("no Tx in the handler's context")
			return
		}
		if attempt == 1 {
			tx.Add(d1client.Statement{SQL: "INSERT INTO no_such_table VALUES (1)"})
		} else {
			tx.Add(d1client.Statement{SQL: "SELECT 1"})
		}
		w.WriteHeader(201)
		w.Write([]byte("created"))
	}})
	r := s.do("POST", "/x", "k", "tok", "{}")
	if r.status != 500 || r.errorCode(t) != idemhttp.CodeMutationAbandoned {
		t.Fatalf("%+v", r)
	}
	if r = s.do("POST", "/x", "k", "tok", "{}"); r.status != 201 || r.body != "created" || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("retry: %+v", r)
	}
	if r = s.do("POST", "/x", "k", "tok", "{}"); r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %+v", r)
	}
}

// A handler statement that d1client refuses before sending (a parameter
// type it cannot send, several statements in one SQL text) fails every
// time: 500 idempotency_mutation_not_committed without Retry-After, as for
// an SQL error, not 503 "retry".
func TestTransactionalCompletionHandlerStatementRefused(t *testing.T) {
	for name, st := range map[string]d1client.Statement{
		"bytes":      {SQL: "SELECT ?", Params: []any{[]byte("x")}},
		"time":       {SQL: "SELECT ?", Params: []any{time.Now()}},
		"two in one": {SQL: "SELECT 1; SELECT 2"},
	} {
		t.Run(name, func(t *testing.T) {
			var runs int
			s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
				runs++
				tx, _ := idemhttp.TxFromContext(r.Context())
				tx.Add(st)
				w.WriteHeader(201)
			}})
			for i := range 2 {
				r := s.do("POST", "/x", "k", "tok", "{}")
				if r.status != 500 || r.errorCode(t) != idemhttp.CodeMutationAbandoned || r.header.Get("Retry-After") != "" {
					t.Fatalf("attempt %d: %+v", i, r)
				}
			}
			if runs != 2 { // released each time: nothing was committed
				t.Errorf("the handler ran %d times", runs)
			}
		})
	}
}

// With Tx statements queued, a flush is held: the client gets the response
// only after the guarded batch committed, and the response is stored like
// any other. When the batch fails, the client gets an error, never the
// handler's 2xx.
func TestTxFlushIsHeldUntilCommit(t *testing.T) {
	var attempts atomic.Int64
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext(r.Context())
		stmt := insertOrder(r.Header.Get("Idempotency-Key"), "me")
		if r.URL.Path == "/fail" && attempts.Add(1) == 1 {
			stmt = d1client.Statement{SQL: "INSERT INTO no_such_table VALUES (1)"}
		}
		if err := tx.Add(stmt); err != nil {
			t.Errorf("Add: %v", err)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("part 1;"))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("a held flush failed: %v", err)
		}
		w.Write([]byte("part 2"))
	}})
	businessTable(t, s.db)

	r := s.do("POST", "/ok", "k-ok", "tok", "{}")
	if r.err != nil || r.status != 201 || r.body != "part 1;part 2" || r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("flushed response: %+v", r)
	}
	if got := orders(t, s.db, "k-ok"); len(got) != 1 {
		t.Fatalf("orders = %v: the business write did not commit", got)
	}
	// The response was stored, not streamed: the retry replays it.
	if r := s.do("POST", "/ok", "k-ok", "tok", "{}"); r.status != 201 || r.body != "part 1;part 2" || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %+v", r)
	}

	// The batch fails: the client gets the error, not the flushed 201.
	r = s.do("POST", "/fail", "k-fail", "tok", "{}")
	if r.status != 500 || r.errorCode(t) != idemhttp.CodeMutationAbandoned || strings.Contains(r.body, "part 1") || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("failed batch: %+v", r)
	}
	if got := orders(t, s.db, "k-fail"); len(got) != 0 {
		t.Fatalf("orders = %v", got)
	}
	// Released: the retry executes, commits and stores.
	if r := s.do("POST", "/fail", "k-fail", "tok", "{}"); r.status != 201 || r.body != "part 1;part 2" || len(orders(t, s.db, "k-fail")) != 1 {
		t.Fatalf("retry: %+v", r)
	}
	if n := s.runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
}

// With Tx statements queued, a hijack is refused; the handler's response
// then commits with them as usual.
func TestTxHijackRefusedWhileQueued(t *testing.T) {
	s := newStack(t, stackOpts{handler: func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext(r.Context())
		if err := tx.Add(insertOrder(r.Header.Get("Idempotency-Key"), "me")); err != nil {
			t.Errorf("Add: %v", err)
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
			t.Error("hijacked with Tx statements queued")
			return
		}
		if !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("hijack error: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("not hijacked"))
	}})
	businessTable(t, s.db)
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.status != 201 || r.body != "not hijacked" || len(orders(t, s.db, "k")) != 1 {
		t.Fatalf("%+v", r)
	}
	if r := s.do("POST", "/x", "k", "tok", "{}"); r.header.Get(idemhttp.HeaderReplayed) != "true" || r.body != "not hijacked" {
		t.Fatalf("replay: %+v", r)
	}
}

// Once the response has streamed (a flush with nothing queued) or the
// connection was hijacked, Add fails with ErrTxClosed and commits nothing;
// the middleware logs it at ERROR, aborts a streamed response so the client
// never reads it as complete, and releases the reservation.
func TestTxAddAfterStreamOrHijackFailsLoudly(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	addErrs := make(chan error, 4)
	s := newStack(t, stackOpts{
		cfg: idem.Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))},
		handler: func(w http.ResponseWriter, r *http.Request) {
			tx, _ := idemhttp.TxFromContext(r.Context())
			insert := insertOrder(r.Header.Get("Idempotency-Key"), "me")
			switch r.URL.Path {
			case "/stream":
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte("streamed;"))
				http.NewResponseController(w).Flush()
				addErrs <- tx.Add(insert)
				w.Write([]byte("the rest"))
			case "/hijack":
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				addErrs <- tx.Add(insert)
				buf.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
				buf.Flush()
				conn.Close()
			}
		},
	})
	businessTable(t, s.db)

	r := s.do("POST", "/stream", "k-stream", "tok", "{}")
	if err := <-addErrs; !errors.Is(err, idemhttp.ErrTxClosed) {
		t.Errorf("Add after a flush: %v", err)
	}
	if r.err == nil {
		t.Errorf("the streamed response completed although its statements were refused: %+v", r)
	}
	s.do("POST", "/hijack", "k-hijack", "tok", "{}")
	if err := <-addErrs; !errors.Is(err, idemhttp.ErrTxClosed) {
		t.Errorf("Add after a hijack: %v", err)
	}
	for _, key := range []string{"k-stream", "k-hijack"} {
		if got := orders(t, s.db, key); len(got) != 0 {
			t.Errorf("%s: orders = %v", key, got)
		}
	}
	// Logged at ERROR, and both reservations released (generation 2).
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		res, err := s.db.Query(bg, "SELECT count(*) FROM idempotency_keys WHERE generation = 2 AND status = 'pending'")
		if err != nil {
			t.Fatal(err)
		}
		released, _ := res.Rows[0][0].Int64()
		if strings.Count(out, "level=ERROR msg=\"idem: the handler added Tx statements after") == 2 && released == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released %d of 2; log:\n%s", released, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
