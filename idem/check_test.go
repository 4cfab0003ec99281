package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Check passes on a database with the schema, and otherwise fails at once
// with the error class and the fix of each misconfiguration, in one call:
// no table, a dropped index, an unknown database.
func TestCheck(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		good := b.NewClientSchema(t)
		if err := newLedger(t, good, idem.Config{}).Check(t.Context()); err != nil {
			t.Errorf("a database with the schema: %v", err)
		}
		before := good.Stats().Calls
		_ = newLedger(t, good, idem.Config{}).Check(t.Context())
		if n := good.Stats().Calls - before; n != 1 {
			t.Errorf("Check made %d D1 calls, want 1", n)
		}

		empty := b.NewClient(t)
		checkFails(t, newLedger(t, empty, idem.Config{}), d1client.ErrSQL, "fix: the ledger table is missing: run `d1idem schema apply`")

		dropped := b.NewClientSchema(t)
		if _, err := dropped.Query(t.Context(), "DROP INDEX "+d1idem.UpdatedAtIndex); err != nil {
			t.Fatal(err)
		}
		checkFails(t, newLedger(t, dropped, idem.Config{}), idem.ErrSchemaDrift, "fix: the ledger table lacks part of the schema: run `d1idem schema apply` (or schema.Apply)")
	})
}

// With a wrong token or an unknown database ID, Check says which and how to fix it.
func TestCheckCredentials(t *testing.T) {
	b := d1test.LocalConfig(t, d1local.Config{Token: "right-token", Dir: t.TempDir()})
	b.Token = "right-token"
	id := b.NewDatabase(t).ID
	wrong := b.Database(id).Client(t, func(c *d1client.Config) { c.APIToken = "wrong-token" })
	checkFails(t, newLedger(t, wrong, idem.Config{}), d1client.ErrAuth, "fix: D1 refused the API token: give it the Account > D1 > Edit permission")

	closed := d1test.LocalConfig(t, d1local.Config{Dir: t.TempDir(), NoAutoCreate: true})
	unknown := closed.Database("no-such-database").Client(t)
	checkFails(t, newLedger(t, unknown, idem.Config{}), d1client.ErrNoDatabase, "fix: the account has no D1 database with this ID: check the database ID")
}

func checkFails(t *testing.T, l *idem.Ledger, want error, fix string) {
	t.Helper()
	err := l.Check(t.Context())
	if !errors.Is(err, want) || !strings.Contains(err.Error(), fix) {
		t.Errorf("Check: %v\nwant an error matching %v that says %q", err, want, fix)
	}
	if err != nil && strings.Contains(err.Error(), "wrong-token") {
		t.Errorf("the error shows the token: %v", err)
	}
}

// A sharded ledger's Check checks every home, then that a ring is recorded.
func TestCheckSharded(t *testing.T) {
	c := newCluster(t, d1test.Local(t), 2)
	l := c.ledger(t, idem.Config{})
	checkFails(t, l, idem.ErrNoRing, "fix: no ring is recorded in the sharded ledger's databases: record one with Admin.InitRing")
	c.initRing(t, idem.Config{})
	if err := l.Check(t.Context()); err != nil {
		t.Errorf("after InitRing: %v", err)
	}
}
