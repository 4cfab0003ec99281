package conformance

import (
	"errors"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestBatchAtomicity: a batch is one transaction. When any statement fails,
// nothing of the batch is committed (DDL included), and the error does not
// say which statement failed. A successful batch returns one result per
// statement, later statements seeing earlier ones' effects.
func TestBatchAtomicity(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		exec(t, c, claim("p1", "k1", "fp1", 1000), claim("p1", "k2", "fp2", 1000))

		// INSERT + a constraint violation.
		_, err := c.Exec(t.Context(), []d1client.Statement{
			claim("p1", "k7", "fp", 700),
			d1client.Statement{SQL: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES (?, ?, ?, 'pending', 1, ?, ?)", Params: []any{"p1", "k1", "dup", 1, 1}},
		})
		e := sqlError(t, err)
		if !errors.Is(err, d1client.ErrConstraint) {
			t.Errorf("want ErrConstraint, got %v", err)
		}
		if e.Message != "UNIQUE constraint failed: idempotency_keys.principal, idempotency_keys.key: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)" {
			t.Errorf("message = %q", e.Message)
		}
		if n := count(t, c, "SELECT count(*) FROM idempotency_keys"); n != 2 {
			t.Errorf("after the failed batch: %d rows, want 2 (k7 rolled back)", n)
		}

		// INSERT + a syntax error.
		_, err = c.Exec(t.Context(), []d1client.Statement{
			claim("p1", "k8", "fp", 800),
			{SQL: "SELEC nonsense"},
		})
		sqlError(t, err)
		if n := count(t, c, "SELECT count(*) FROM idempotency_keys WHERE key = 'k8'"); n != 0 {
			t.Errorf("k8 committed despite the failed batch")
		}

		// DDL + UPDATE + a missing table: the DDL and the UPDATE roll back too.
		_, err = c.Exec(t.Context(), []d1client.Statement{
			{SQL: "CREATE TABLE t_ddl (x INTEGER)"},
			{SQL: "CREATE INDEX t_ddl_x ON t_ddl (x)"},
			d1client.Statement{SQL: "UPDATE idempotency_keys SET status = 'completed' WHERE key = ?", Params: []any{"k1"}},
			{SQL: "SELECT * FROM nope"},
		})
		e = sqlError(t, err)
		if e.Message != "no such table: nope: SQLITE_ERROR" {
			t.Errorf("message = %q", e.Message)
		}
		if n := count(t, c, "SELECT count(*) FROM sqlite_master WHERE name IN ('t_ddl', 't_ddl_x')"); n != 0 {
			t.Errorf("the DDL of a failed batch was committed (%d objects)", n)
		}
		if n := count(t, c, "SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"); n != 0 {
			t.Errorf("the UPDATE of a failed batch was committed")
		}

		// A successful batch: one result per statement, in order, and each
		// statement sees the earlier ones.
		res := exec(t, c,
			d1client.Statement{SQL: "CREATE TABLE t_ok (x INTEGER)"},
			d1client.Statement{SQL: "INSERT INTO t_ok (x) VALUES (?), (?) RETURNING x", Params: []any{1, 2}},
			d1client.Statement{SQL: "SELECT sum(x) AS s FROM t_ok"},
			claim("p1", "k9", "fp", 900),
		)
		if len(res) != 4 {
			t.Fatalf("%d results for 4 statements", len(res))
		}
		wantTable(t, &res[0], `[]`, `[]`)
		wantTable(t, &res[1], `["x"]`, `[[1],[2]]`)
		wantTable(t, &res[2], `["s"]`, `[[3]]`)
		wantTable(t, &res[3], `["key","generation"]`, `[["k9",1]]`)
		if res[1].Meta.Changes != 2 {
			t.Errorf("INSERT of two rows: meta.changes = %d, want 2", res[1].Meta.Changes)
		}
	})
}

// TestErrorShapes: how SQL errors reach a client. Every one is HTTP 400 with
// code 7500 and a message "<sqlite message>: SQLITE_<CODE>" (no "D1_ERROR: "
// prefix), which d1client maps to ErrSQL with SQLiteCode parsed.
func TestErrorShapes(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		exec(t, c, claim("p", "k", "fp", 1))

		t.Run("syntax", func(t *testing.T) {
			_, err := c.Query(t.Context(), "SELEC 1")
			e := sqlError(t, err)
			if e.Message != `near "SELEC": syntax error at offset 0: SQLITE_ERROR` {
				t.Errorf("message = %q", e.Message)
			}
			if e.SQLiteCode != "SQLITE_ERROR" || e.ExtendedCode != "" {
				t.Errorf("codes = %q/%q, want SQLITE_ERROR/\"\"", e.SQLiteCode, e.ExtendedCode)
			}
			if errors.Is(err, d1client.ErrConstraint) {
				t.Errorf("a syntax error matches ErrConstraint")
			}
		})

		t.Run("no such column", func(t *testing.T) {
			_, err := c.Query(t.Context(), "SELECT nope FROM idempotency_keys")
			e := sqlError(t, err)
			if e.Message != "no such column: nope at offset 7: SQLITE_ERROR" {
				t.Errorf("message = %q", e.Message)
			}
		})

		t.Run("primary key", func(t *testing.T) {
			_, err := c.Query(t.Context(), "INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES (?, ?, ?, ?, ?)", "p", "k", "fp", 1, 1)
			e := sqlError(t, err)
			if !errors.Is(err, d1client.ErrConstraint) {
				t.Errorf("errors.Is(err, ErrConstraint) = false for %v", err)
			}
			if e.SQLiteCode != "SQLITE_CONSTRAINT" || e.ExtendedCode != "SQLITE_CONSTRAINT_PRIMARYKEY" {
				t.Errorf("codes = %q/%q", e.SQLiteCode, e.ExtendedCode)
			}
			if e.Message != "UNIQUE constraint failed: idempotency_keys.principal, idempotency_keys.key: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)" {
				t.Errorf("message = %q", e.Message)
			}
		})

		t.Run("not null", func(t *testing.T) {
			_, err := c.Query(t.Context(), "INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES (?, ?, ?, ?, ?)", "p", "k2", nil, 1, 1)
			e := sqlError(t, err)
			if !errors.Is(err, d1client.ErrConstraint) {
				t.Errorf("errors.Is(err, ErrConstraint) = false for %v", err)
			}
			if e.Message != "NOT NULL constraint failed: idempotency_keys.fingerprint: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_NOTNULL)" {
				t.Errorf("message = %q", e.Message)
			}
		})

		// SQL transactions are refused: D1 runs every call in its own
		// transaction. Local workerd says "To execute a transaction, please
		// use the state.storage.transaction() ..."; production D1 is
		// documented to say "cannot start a transaction within a
		// transaction". Both mention "transaction", which is all this
		// asserts about the text.
		for _, stmt := range []string{"BEGIN", "BEGIN TRANSACTION", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK", "SAVEPOINT sp1"} {
			t.Run(stmt, func(t *testing.T) {
				_, err := c.Query(t.Context(), stmt)
				e := sqlError(t, err)
				if !strings.Contains(strings.ToLower(e.Message), "transaction") {
					t.Errorf("message %q does not mention transactions", e.Message)
				}
				if errors.Is(err, d1client.ErrConstraint) {
					t.Errorf("%s matches ErrConstraint", stmt)
				}
			})
		}

		t.Run("empty", func(t *testing.T) {
			// d1client refuses empty SQL before sending; over HTTP both
			// backends answer 400/7500.
			db := b.NewDatabase(t)
			res := db.Post(t, "raw", `{"sql":""}`)
			wantEnvelopeError(t, res, 400, 7500, "No SQL statements detected.")
			res = db.Post(t, "raw", `{"sql":"-- only a comment"}`)
			wantEnvelopeError(t, res, 400, 7500, "SQL code did not contain a statement.")
		})

		t.Run("wrong number of parameters", func(t *testing.T) {
			_, err := c.Query(t.Context(), "SELECT ?, ?", 1)
			e := sqlError(t, err)
			if e.Message != "Wrong number of parameter bindings for SQL query." {
				t.Errorf("message = %q", e.Message)
			}
		})

		t.Run("not authorized", func(t *testing.T) {
			_, err := c.Query(t.Context(), "SELECT sqlite_version()")
			e := sqlError(t, err)
			if e.Message != "not authorized to use function: sqlite_version at offset 7: SQLITE_ERROR" {
				t.Errorf("message = %q", e.Message)
			}
		})
	})
}

// TestUnknownDatabase: a database ID the account does not have answers 404
// with code 7404, which d1client reports as ErrNoDatabase. d1local creates
// databases on first use by default, so its leg runs with NoAutoCreate.
func TestUnknownDatabase(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		id := "no-such-database"
		if b.Local != nil {
			b = d1test.LocalConfig(t, d1local.Config{NoAutoCreate: true})
		}
		db := b.Database(id)
		_, err := db.Client(t).Query(t.Context(), "SELECT 1")
		var e *d1client.Error
		if !errors.Is(err, d1client.ErrNoDatabase) || errors.Is(err, d1client.ErrAuth) || !errors.As(err, &e) || e.StatusCode != 404 || len(e.Codes) != 1 || e.Codes[0] != 7404 {
			t.Fatalf("err = %v, want ErrNoDatabase, HTTP 404, code 7404", err)
		}
		res := db.Post(t, "raw", `{"sql":"SELECT 1"}`)
		wantEnvelopeError(t, res, 404, 7404, "The database "+id+" could not be found")
	})
}
