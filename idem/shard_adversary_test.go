package idem_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// The tests of this file play an operator's mistakes and an attacker's
// writes against a sharded ledger: conflicting rings, one database under
// two home IDs, a ring that drops a home, error texts that say nothing.
// Each fails on a ledger that routes by epoch alone, trusts its Homes, or
// recognises its guards by the text of an error.

// rewriteProxy returns b reached through a proxy that passes each answer's
// body through rewrite.
func rewriteProxy(t testing.TB, b *d1test.Backend, rewrite func([]byte) []byte) *d1test.Backend {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fwd, _ := http.NewRequestWithContext(r.Context(), r.Method, b.BaseURL+r.URL.RequestURI(), bytes.NewReader(body))
		fwd.Header = r.Header.Clone()
		res, err := b.HTTPClient.Do(fwd)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		data = rewrite(data)
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(res.StatusCode)
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	pb := *b
	pb.BaseURL = srv.URL
	return &pb
}

// sqliteCode is the end of a D1 SQL error's message: its SQLite code.
var sqliteCode = regexp.MustCompile(`:\s*SQLITE_[A-Z_]+(\s*\(extended:\s*SQLITE_[A-Z_]+\))?\s*$`)

// blankMessages replaces the text of every error message of a D1 answer
// with "[REDACTED]", keeping only its SQLite code: what a redaction that
// swallowed the message, or a D1 that worded it otherwise, would leave.
func blankMessages(body []byte) []byte {
	var env map[string]any
	if json.Unmarshal(body, &env) != nil {
		return body
	}
	errs, _ := env["errors"].([]any)
	for _, e := range errs {
		if m, ok := e.(map[string]any); ok {
			msg, _ := m["message"].(string)
			m["message"] = "[REDACTED]" + sqliteCode.FindString(msg)
		}
	}
	out, _ := json.Marshal(env)
	return out
}

// ringRow is a ring row's generation, fingerprint and body.
type ringRow struct {
	gen      int64
	fp, body string
}

// ringBody is the ring row's body for r, as the ledger writes it.
func ringBody(r idem.Ring) string {
	b, _ := json.Marshal(struct {
		Format   string         `json:"format"`
		Version  int64          `json:"version"`
		Phase    idem.RingPhase `json:"phase"`
		Homes    []string       `json:"homes"`
		Previous []string       `json:"previous,omitempty"`
	}{"d1idem-ring/1", r.Version, r.Phase, r.Homes, r.Previous})
	return string(b)
}

// forged is the ring row a ring of r's content would have.
func forged(r idem.Ring) ringRow {
	body := ringBody(r)
	return ringRow{r.Epoch(), fmt.Sprintf("%x", sha256.Sum256([]byte(body))), body}
}

// readRingRow returns database id's ring row.
func (c *cluster) readRingRow(t testing.TB, id string) ringRow {
	t.Helper()
	res, err := c.dbs[id].Query(bg, "SELECT generation, fingerprint, response_body FROM idempotency_keys WHERE principal = '' AND key = 'd1idem:ring'")
	if err != nil || len(res.Rows) != 1 {
		t.Fatalf("%s: ring row %v, %v", id, res, err)
	}
	var row ringRow
	if err := res.Rows[0].Scan(&row.gen, &row.fp, &row.body); err != nil {
		t.Fatal(err)
	}
	return row
}

// writeRingRow overwrites database id's ring row, as only someone with
// full SQL access can.
func (c *cluster) writeRingRow(t testing.TB, id string, row ringRow) {
	t.Helper()
	if _, err := c.dbs[id].Query(bg, "UPDATE idempotency_keys SET generation = ?, fingerprint = ?, response_body = ? WHERE principal = '' AND key = 'd1idem:ring'",
		row.gen, row.fp, row.body); err != nil {
		t.Fatal(err)
	}
}

// A ring init that recorded the ring in some of its databases (the rest
// failing) leaves those databases joined to that ring: a second init over
// a different set that shares one of them is refused, so two rings never
// route one principal to two homes. Where the first init failed before
// recording anything, the second one is the only ring.
func TestInitRingRefusesAHomeOfAnUnfinishedRing(t *testing.T) {
	for _, failing := range []string{"ring writes", "everything"} {
		t.Run(failing, func(t *testing.T) {
			var down sync.Map
			b := d1test.LocalConfig(t, d1local.Config{Faults: func(r d1local.Request) d1local.Fault {
				what, ok := down.Load(r.DatabaseID)
				if ok && (what == "everything" || strings.Contains(strings.Join(r.Statements, "\n"), "response_body = excluded.response_body")) {
					return d1local.Fault{Internal: true}
				}
				return d1local.Fault{}
			}})
			fast := func(c *d1client.Config) { c.Retry = d1client.NoRetry() }
			c := newCluster(t, b, 3, fast)
			a, shared, other := c.ids[0], c.ids[1], c.ids[2]
			cfg := idem.Config{Heartbeat: -1}
			down.Store(shared, failing)
			if _, err := c.ledger(t, cfg, a, shared).Admin().InitRing(bg); err == nil {
				t.Fatal("the first init succeeded with a database failing")
			}
			down.Delete(shared)
			_, err := c.ledger(t, cfg, shared, other).Admin().InitRing(bg)
			if failing == "ring writes" {
				if !errors.Is(err, idem.ErrRingConflict) || !strings.Contains(err.Error(), "joined v1 stable ["+a+" "+shared+"]") {
					t.Fatalf("the second init over a database of the first: %v, want ErrRingConflict naming the first ring", err)
				}
			} else if err != nil {
				t.Fatalf("the second init, the first having recorded nothing: %v", err)
			}
			// Two replicas, one given each pair, never execute one key in
			// two databases.
			first, second := c.ledger(t, cfg, a, shared), c.ledger(t, cfg, shared, other)
			for i := range 40 {
				p := fmt.Sprint("acct-", i)
				executed := 0
				for _, l := range []*idem.Ledger{first, second} {
					if d, err := l.Begin(bg, p, "k", "fp"); err == nil && d.Outcome == idem.Execute {
						executed++
					}
				}
				if executed > 1 || len(c.where(t, p, "k")) > 1 {
					t.Fatalf("%s/k executed by %d replicas, in %v", p, executed, c.where(t, p, "k"))
				}
			}
		})
	}
}

// Two rings of one epoch (written by hand, or by a bug) are never served:
// a replica that meets the second one at a database refuses it, naming
// both, and then serves nothing, not even principals of databases that
// agree with it, until the rings agree again; a replica that starts then
// refuses them too.
func TestConflictingRingsAreNeverServed(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := newCluster(t, b, 3)
		cfg := idem.Config{Heartbeat: -1}
		v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
		replica := c.ledger(t, cfg)
		mustRing(t, replica)
		atA := principal(t, func(p string) bool { return v1.Home(p) == c.ids[0] })
		atB := principal(t, func(p string) bool { return v1.Home(p) == c.ids[1] })
		original := c.readRingRow(t, c.ids[1])
		other := idem.Ring{Version: 1, Phase: idem.RingStable, Homes: []string{c.ids[1], c.ids[2]}}
		c.writeRingRow(t, c.ids[1], forged(other))

		_, err := replica.Begin(bg, atB, "k", "fp")
		if !errors.Is(err, idem.ErrRingConflict) || !strings.Contains(err.Error(), v1.String()) || !strings.Contains(err.Error(), other.String()) {
			t.Fatalf("a claim at the database holding another ring of the epoch: %v, want ErrRingConflict naming both", err)
		}
		if _, err := replica.Begin(bg, atA, "k", "fp"); !errors.Is(err, idem.ErrRingConflict) {
			t.Errorf("after the conflict, a principal of an agreeing database: %v, want the conflict", err)
		}
		if _, err := c.ledger(t, cfg).Begin(bg, atA, "k", "fp"); !errors.Is(err, idem.ErrRingConflict) {
			t.Errorf("a replica starting meanwhile: %v, want the conflict", err)
		}
		if got := c.where(t, atB, "k"); len(got) != 0 {
			t.Errorf("%s/k was claimed in %v", atB, got)
		}

		// Repaired, the rings agree again and the replica serves.
		if forged(v1) != original {
			t.Fatalf("the recorded row %+v is not the ring's own %+v", original, forged(v1))
		}
		c.writeRingRow(t, c.ids[1], original)
		if _, err := replica.RefreshRing(bg); err != nil {
			t.Fatal(err)
		}
		if d := begin(t, replica, atB, "k", "fp"); d.Outcome != idem.Execute {
			t.Errorf("after the repair: %v", d.Outcome)
		}
	})
}

// Rings only grow: a newer ring that drops a home is refused, by a replica
// that meets it at a database and by one that starts, so a principal of
// the dropped home is never executed again elsewhere.
func TestRingThatDropsAHomeIsRefused(t *testing.T) {
	b := d1test.Local(t)
	c := newCluster(t, b, 2)
	cfg := idem.Config{Heartbeat: -1}
	v1 := c.initRing(t, cfg, c.ids...)
	replica := c.ledger(t, cfg)
	atA := principal(t, func(p string) bool { return v1.Home(p) == c.ids[0] })
	atB := principal(t, func(p string) bool { return v1.Home(p) == c.ids[1] })
	d := begin(t, replica, atA, "k", "fp")
	if _, err := replica.Complete(bg, d.Reservation, idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	c.writeRingRow(t, c.ids[1], forged(idem.Ring{Version: 2, Phase: idem.RingStable, Homes: []string{c.ids[1]}}))
	for name, l := range map[string]*idem.Ledger{"running": replica, "starting": c.ledger(t, cfg)} {
		for _, p := range []string{atB, atA} {
			d, err := l.Begin(bg, p, "k", "fp")
			if err == nil {
				t.Errorf("%s replica, %s: %v, want a refusal", name, p, d.Outcome)
			} else if !errors.Is(err, idem.ErrRingConflict) || !strings.Contains(err.Error(), "drops ["+c.ids[0]+"]") {
				t.Errorf("%s replica, %s: %v, want ErrRingConflict naming the dropped home", name, p, err)
			}
		}
	}
	if got := c.where(t, atA, "k"); len(got) != 1 || got[0] != c.ids[0] {
		t.Errorf("%s/k is in %v", atA, got)
	}
}

// One database given under two home IDs is refused: at NewSharded when
// both reach it at the same address, by InitRing otherwise, and by a
// replica whose Homes disagree with the IDs the databases recorded, which
// serves nothing, so no key executes in two databases.
func TestOneDatabaseUnderTwoHomeIDs(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := newCluster(t, b, 2)
		x := c.ids[0]
		cfg := idem.Config{Heartbeat: -1}
		if _, err := idem.NewSharded([]idem.Home{{ID: "a", DB: c.dbs[x]}, {ID: "b", DB: c.dbs[x]}}, cfg); !errors.Is(err, idem.ErrHomeMismatch) {
			t.Errorf("NewSharded with one database twice: %v", err)
		}
		// The same database at another address: NewSharded cannot tell.
		viaProxy := rewriteProxy(t, b, func(b []byte) []byte { return b }).Database(x).Client(t)
		dup, err := idem.NewSharded([]idem.Home{{ID: "a", DB: c.dbs[x]}, {ID: "b", DB: viaProxy}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dup.Admin().InitRing(bg); !errors.Is(err, idem.ErrHomeMismatch) {
			t.Errorf("InitRing over one database under two IDs: %v", err)
		}

		// Another database, a, with a ring over {a: x, b: y}; a replica
		// given x as both.
		d := newCluster(t, b, 2)
		op, err := idem.NewSharded([]idem.Home{{ID: "a", DB: d.dbs[d.ids[0]]}, {ID: "b", DB: d.dbs[d.ids[1]]}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		st, err := op.Admin().InitRing(bg)
		if err != nil {
			t.Fatal(err)
		}
		proxied := rewriteProxy(t, b, func(b []byte) []byte { return b }).Database(d.ids[0]).Client(t)
		wrong, err := idem.NewSharded([]idem.Home{{ID: "a", DB: d.dbs[d.ids[0]]}, {ID: "b", DB: proxied}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		atB := principal(t, func(p string) bool { return st.Ring.Home(p) == "b" })
		if _, err := wrong.Begin(bg, atB, "k", "fp"); !errors.Is(err, idem.ErrHomeMismatch) {
			t.Fatalf("a replica given one database as two homes: %v, want ErrHomeMismatch", err)
		}
		if d := begin(t, op, atB, "k", "fp"); d.Outcome != idem.Execute {
			t.Fatalf("the right replica: %v", d.Outcome)
		}
		if n := len(d.where(t, atB, "k")); n != 1 {
			t.Errorf("%s/k is in %d databases", atB, n)
		}
	})
}

// The guards are recognised by what the database holds, never by the text
// of an error: with every error message blanked but for its SQLite code, a
// replica on an older ring still learns the new one and routes again.
func TestRingGuardRecognisedWithoutMessages(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		blank := rewriteProxy(t, b, blankMessages)
		c := newCluster(t, b, 3)
		clk := newClock()
		cfg := idem.Config{Heartbeat: -1, Clock: clk.Now, TTL: time.Second}
		v1 := c.initRing(t, cfg, c.ids[0], c.ids[1])
		var homes []idem.Home
		for _, id := range c.ids {
			homes = append(homes, idem.Home{DB: blank.Database(id).Client(t)})
		}
		stale, err := idem.NewSharded(homes, cfg)
		if err != nil {
			t.Fatal(err)
		}
		mustRing(t, stale)
		if _, err := c.ledger(t, cfg).Admin().Grow(bg, c.ids[2]); err != nil {
			t.Fatal(err)
		}
		v2 := grown(v1, c.ids[2])
		p := principal(t, func(p string) bool { return v2.PreviousHome(p) != "" })
		d, err := stale.Begin(bg, p, "k", "fp")
		if err != nil || d.Outcome != idem.Execute {
			t.Fatalf("a replica on v1, its guard refused with a blank message: %v, %v", d.Outcome, err)
		}
		if r := mustRing(t, stale); r.String() != v2.String() {
			t.Errorf("it routes by %s, want %s", r, v2)
		}
		if got := c.where(t, p, "k"); len(got) != 1 || got[0] != v2.Home(p) {
			t.Errorf("%s/k is in %v, want its new home %s", p, got, v2.Home(p))
		}

	})
}

// The fence guard of a transactional completion is recognised without its
// message too: fenced out, the completion reports it (its business write
// aborted), and a handler's own failing statement is its own error.
func TestFenceGuardRecognisedWithoutMessages(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		clk := newClock()
		cfg := idem.Config{Heartbeat: -1, Clock: clk.Now, TTL: time.Second}
		plain := b.NewClientSchema(t)
		db := rewriteProxy(t, b, blankMessages).Database(plain.DatabaseID()).Client(t)
		if _, err := plain.Query(bg, "CREATE TABLE biz (k TEXT NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		l := newLedger(t, db, cfg)
		owner := begin(t, l, "acct", "k2", "fp")
		clk.Advance(2 * time.Second)
		if d := begin(t, l, "acct", "k2", "fp"); !d.Reservation.Takeover {
			t.Fatalf("no takeover: %+v", d)
		}
		done, err := l.CompleteTx(bg, owner.Reservation, idem.Response{Status: 201}, []d1client.Statement{{SQL: "INSERT INTO biz VALUES ('fenced')"}})
		if err != nil || done.Stored {
			t.Errorf("a fenced-out transactional completion, its guard's message blank: stored %v, %v", done.Stored, err)
		}
		mine := begin(t, l, "acct", "k3", "fp")
		_, err = l.CompleteTx(bg, mine.Reservation, idem.Response{Status: 201}, []d1client.Statement{{SQL: "INSERT INTO biz VALUES (NULL)"}})
		if !errors.Is(err, idem.ErrTxNotCommitted) || !errors.Is(err, d1client.ErrConstraint) {
			t.Errorf("the handler's own NOT NULL violation, its message blank: %v", err)
		}
		res, err := plain.Query(bg, "SELECT count(*) FROM biz")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := res.Rows[0].Scan(&n); err != nil || n != 0 {
			t.Errorf("%d business rows committed, want 0", n)
		}
	})
}
