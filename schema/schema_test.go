package schema_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
	"github.com/d1idem/d1idem/schema"
)

var ctx = context.Background()

func want(t *testing.T, b *d1test.Backend) schema.Shape {
	t.Helper()
	sh, err := schema.ShapeOf(ctx, b.NewClient(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Columns) != 10 || len(sh.Indexes) != 2 {
		t.Fatalf("schema.sql shape: %+v", sh)
	}
	return sh
}

func TestApplyIsIdempotentAndRecorded(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		w := want(t, b)
		db := b.NewClient(t)
		p, err := schema.Apply(ctx, db, w, schema.Options{})
		if err != nil || p.Action != schema.CreateAndRecord {
			t.Fatalf("first apply: %v %v", p.Action, err)
		}
		p, err = schema.Apply(ctx, db, w, schema.Options{})
		if err != nil || p.Action != schema.Nothing || len(p.Statements) != 0 {
			t.Fatalf("second apply: %v %v", p.Action, err)
		}
		// Recorded the way wrangler records migrations.
		res, err := db.Query(ctx, "SELECT id, name, typeof(applied_at) FROM d1_migrations")
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) != 1 || res.Rows[0][1] != d1client.TextValue(schema.MigrationName) || res.Rows[0][2] != d1client.TextValue("text") {
			t.Fatalf("d1_migrations = %v", res.Rows)
		}
		got, err := schema.Inspect(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if d := schema.Diff(w, got); len(d) != 0 {
			t.Fatalf("drift after apply: %v", d)
		}
	})
}

func TestApplyRecordsAnExistingTableOrRefusesDrift(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		w := want(t, b)
		// A table created by hand (or by a Worker) with the right shape is
		// recorded, not recreated.
		db := b.NewClientSchema(t)
		p, err := schema.Apply(ctx, db, w, schema.Options{})
		if err != nil || p.Action != schema.RecordOnly {
			t.Fatalf("existing table: %v %v", p.Action, err)
		}
		// A drifted table is refused, with a readable diff.
		drifted := b.NewClient(t)
		if _, err := drifted.Exec(ctx, []d1client.Statement{
			{SQL: strings.Replace(d1idem.SchemaStatements()[0], "status            TEXT NOT NULL DEFAULT 'pending'", "status TEXT", 1)},
		}); err != nil {
			t.Fatal(err)
		}
		_, err = schema.Apply(ctx, drifted, w, schema.Options{})
		if !errors.Is(err, schema.ErrDrift) {
			t.Fatalf("drift: %v", err)
		}
		for _, line := range []string{"- column status TEXT NOT NULL DEFAULT 'pending'", "+ column status TEXT", "- index idx_idempotency_keys_updated_at on (updated_at)"} {
			if !strings.Contains(err.Error(), line) {
				t.Errorf("diff lacks %q:\n%v", line, err)
			}
		}
	})
}

func TestConcurrentApplies(t *testing.T) {
	b := d1test.Local(t)
	w := want(t, b)
	d := b.NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := schema.Apply(ctx, d.Client(t), w, schema.Options{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	res, _ := d.Client(t).Query(ctx, "SELECT count(*) FROM d1_migrations")
	if n, _ := res.Rows[0][0].Int64(); n != 1 {
		t.Errorf("%d migration records", n)
	}
}

func TestRecordedButMissingTable(t *testing.T) {
	b := d1test.Local(t)
	w := want(t, b)
	db := b.NewClient(t)
	if _, err := schema.Apply(ctx, db, w, schema.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Query(ctx, "DROP TABLE idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.Apply(ctx, db, w, schema.Options{}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("err = %v", err)
	}
	if _, err := schema.MakePlan(ctx, db, w, schema.Options{MigrationsTable: "bad name"}); err == nil {
		t.Error("bad migrations table accepted")
	}
}
