package d1client_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

func countRows(t *testing.T, db *d1client.Client, table string) int64 {
	t.Helper()
	res, err := db.Query(ctx, "SELECT count(*) FROM "+table)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := res.Rows[0][0].Int64()
	return n
}

// A write is a write however it is spelled: after a 500 that followed the
// commit, it is reported as ambiguous and never sent again, so it runs once.
func TestWriteSpelledLikeAReadIsNotResent(t *testing.T) {
	for _, tc := range []struct{ sql, want string }{ // want: count(*), sum(x) afterwards
		{"WITH v AS (SELECT ? AS x)INSERT INTO log (x) SELECT x FROM v", "[2 2]"},
		{"WITH v AS (SELECT ? AS x) INSERT/**/INTO log (x) SELECT x FROM v", "[2 2]"},
		{"WITH v AS (SELECT ? AS x)\nREPLACE INTO log (x) SELECT x FROM v", "[2 2]"},
		{"WITH v AS (SELECT ? AS x)UPDATE log SET x = x + 1 WHERE x >= (SELECT x FROM v)", "[1 2]"},
		{"WITH v AS (SELECT ? AS x) SELECT x FROM v; INSERT INTO log (x) VALUES (1)", "[1 1]"}, // refused
	} {
		t.Run(tc.sql, func(t *testing.T) {
			b := d1test.Local(t)
			db := b.NewClient(t, func(c *d1client.Config) {
				c.Retry = d1client.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
			})
			if _, err := db.Exec(ctx, []d1client.Statement{{SQL: "CREATE TABLE log (x INTEGER)"}, {SQL: "INSERT INTO log (x) VALUES (1)"}}); err != nil {
				t.Fatal(err)
			}
			refused := strings.Contains(tc.sql, ";")
			if !refused {
				b.Local.Inject(d1local.Fault{Internal: true, AfterCommit: true})
			}
			_, err := db.Query(ctx, tc.sql, 1)
			var e *d1client.Error
			switch {
			case refused:
				if !errors.Is(err, d1client.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
			case !errors.Is(err, d1client.ErrTransient) || !errors.As(err, &e) || !e.Ambiguous || e.Attempts != 1:
				t.Fatalf("err = %v, want one ambiguous ErrTransient attempt", err)
			}
			res, err := db.Query(ctx, "SELECT count(*), sum(x) FROM log")
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(res.Rows[0]); got != tc.want {
				t.Fatalf("log holds %s (count, sum), want %s", got, tc.want)
			}
		})
	}
}

// SQL holding several statements is refused before anything is sent, in
// solo and coalesced calls alike; a read followed by a write is not retried
// as a read.
func TestMultiStatementSQLIsRefused(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClient(t)
	if _, err := db.Query(ctx, "CREATE TABLE log (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	before := db.Stats().Calls
	for _, sql := range []string{
		"SELECT 1; INSERT INTO log VALUES (1)",
		"SELECT 1; SELECT 2",
		"SELECT 1;INSERT INTO log VALUES (1);",
		"-- only a comment",
	} {
		for _, opts := range [][]d1client.ExecOption{nil, {d1client.Coalesce()}, {d1client.Idempotent()}} {
			_, err := db.Exec(ctx, []d1client.Statement{{SQL: "SELECT 0"}, {SQL: sql}}, opts...)
			if !errors.Is(err, d1client.ErrInvalid) || !strings.Contains(err.Error(), "statement 2 holds") {
				t.Errorf("%q: err = %v, want ErrInvalid for statement 2", sql, err)
			}
		}
	}
	if _, err := db.Query(ctx, "SELECT 1; SELECT 2"); err == nil || !strings.Contains(err.Error(), "pass each as its own Statement") {
		t.Errorf("err = %v, want advice to pass separate Statements", err)
	}
	if n := db.Stats().Calls - before; n != 0 {
		t.Errorf("%d calls sent for refused SQL", n)
	}
	if n := countRows(t, db, "log"); n != 0 {
		t.Errorf("%d rows written by refused SQL", n)
	}
	// A trigger's body is one statement, whatever its semicolons.
	if _, err := db.Query(ctx, "CREATE TRIGGER log_twice AFTER INSERT ON log WHEN new.x = 1 BEGIN INSERT INTO log VALUES (2); END"); err != nil {
		t.Fatalf("CREATE TRIGGER: %v", err)
	}
}
