package idem_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/internal/specseq"
)

func ourOutcome(d idem.Decision) string {
	switch d.Outcome {
	case idem.Execute:
		return fmt.Sprintf("execute gen=%d takeover=%v", d.Reservation.Generation, d.Reservation.Takeover)
	case idem.Replay:
		return fmt.Sprintf("replay status=%d body=%q", d.Response.Status, d.Response.Body)
	}
	return d.Outcome.String()
}

// Round trip 1 is equivalent to the spec's claim, lookup and takeover run in
// sequence: from the same starting rows, both reach the same outcome and
// leave the same rows.
func TestRoundTripOneEquivalentToSpec(t *testing.T) {
	const ttl = 30 * time.Second
	now := time.UnixMilli(1_767_225_600_000)
	at := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	type row struct {
		principal, key, fp, status string
		gen                        int64
		respStatus                 any
		body, headers              any
		created, updated           int64
	}
	scenarios := []struct {
		name string
		rows []row
	}{
		{"no row", nil},
		{"pending, same fingerprint, fresh", []row{{"p", "k", "fp", "pending", 1, nil, nil, nil, at(time.Second), at(time.Second)}}},
		{"pending, same fingerprint, stale", []row{{"p", "k", "fp", "pending", 1, nil, nil, nil, at(40 * time.Second), at(40 * time.Second)}}},
		{"pending, same fingerprint, exactly the TTL old", []row{{"p", "k", "fp", "pending", 1, nil, nil, nil, at(ttl), at(ttl)}}},
		{"pending, same fingerprint, 1 ms past the TTL", []row{{"p", "k", "fp", "pending", 1, nil, nil, nil, at(ttl + time.Millisecond), at(ttl + time.Millisecond)}}},
		{"pending at generation 3, stale", []row{{"p", "k", "fp", "pending", 3, nil, nil, nil, at(time.Hour), at(time.Minute)}}},
		{"pending, other fingerprint, fresh", []row{{"p", "k", "other", "pending", 1, nil, nil, nil, at(time.Second), at(time.Second)}}},
		{"pending, other fingerprint, stale", []row{{"p", "k", "other", "pending", 1, nil, nil, nil, at(time.Hour), at(time.Hour)}}},
		{"completed, same fingerprint", []row{{"p", "k", "fp", "completed", 2, 201, `{"id":1}`, `{"content-type":"application/json"}`, at(time.Hour), at(time.Minute)}}},
		{"completed, same fingerprint, stale", []row{{"p", "k", "fp", "completed", 1, 200, "ok", "{}", at(time.Hour), at(time.Hour)}}},
		{"completed sentinel (null body and status)", []row{{"p", "k", "fp", "completed", 1, nil, nil, "{}", at(time.Hour), at(time.Minute)}}},
		{"completed, other fingerprint", []row{{"p", "k", "other", "completed", 1, 200, "ok", "{}", at(time.Hour), at(time.Minute)}}},
		{"same key under another principal only", []row{{"q", "k", "fp", "pending", 1, nil, nil, nil, at(time.Hour), at(time.Hour)}}},
	}
	seed := func(t *testing.T, db *d1client.Client, rows []row) {
		for _, r := range rows {
			_, err := db.Query(bg, `INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.principal, r.key, r.fp, r.status, r.gen, r.respStatus, r.body, r.headers, r.created, r.updated)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	dump := func(t *testing.T, db *d1client.Client) []d1client.Row {
		res, err := db.Query(bg, "SELECT principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at FROM idempotency_keys ORDER BY principal, key")
		if err != nil {
			t.Fatal(err)
		}
		return res.Rows
	}
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) {
				specDB, ourDB := b.NewClientSchema(t), b.NewClientSchema(t)
				seed(t, specDB, sc.rows)
				seed(t, ourDB, sc.rows)
				spec, err := specseq.Begin(bg, specDB, "p", "k", "fp", now, ttl)
				if err != nil {
					t.Fatal(err)
				}
				want := spec.Text
				l := newLedger(t, ourDB, idem.Config{TTL: ttl, Clock: func() time.Time { return now }, Heartbeat: -1})
				d, err := l.Begin(bg, "p", "k", "fp")
				if err != nil {
					t.Fatal(err)
				}
				if got := ourOutcome(d); got != want {
					t.Errorf("outcome: ours %q, spec %q", got, want)
				}
				if a, b := dump(t, specDB), dump(t, ourDB); !reflect.DeepEqual(a, b) {
					t.Errorf("final rows differ:\nspec %v\nours %v", a, b)
				}
			})
		}
	})
}
