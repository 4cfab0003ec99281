package conformance

import (
	"testing"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/internal/d1test"
)

// TestMeta: the per-statement meta fields a client may act on agree:
// changes, changed_db, and last_row_id after an INSERT that inserted.
//
// The billing counters legitimately differ and are asserted per backend:
// workerd (like production D1) counts index entries in rows_written, so a
// claim writes 3 (the row, the primary-key index, the updated_at index);
// d1local counts table rows only (1). duration (whole milliseconds on
// workerd, whose timer is coarsened), size_after and served_by are not
// compared.
func TestMeta(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		c := b.NewClientSchema(t)
		res := exec(t, c,
			claim("p", "k1", "fp", 1000),
			claim("p", "k2", "fp", 1000),
			claim("p", "k1", "fp", 1000), // conflict: nothing written
			lookup("p", "k1"),
		)
		type want struct {
			changes, lastRowID int64
			changed            bool
		}
		for i, w := range []want{{1, 1, true}, {1, 2, true}, {0, 2, false}, {0, 2, false}} {
			m := res[i].Meta
			if m.Changes != w.changes || m.LastRowID != w.lastRowID || m.ChangedDB != w.changed {
				t.Errorf("statement %d: changes %d, last_row_id %d, changed_db %v; want %d, %d, %v",
					i, m.Changes, m.LastRowID, m.ChangedDB, w.changes, w.lastRowID, w.changed)
			}
		}
		if m := res[0].Meta; m.SizeAfter <= 0 {
			t.Errorf("size_after = %d, want > 0", m.SizeAfter)
		}

		wantWritten := int64(3) // workerd: row + 2 index entries
		if b.Name == d1test.NameLocal {
			wantWritten = 1 // d1local: table rows only (a known difference)
		}
		if got := res[0].Meta.RowsWritten; got != wantWritten {
			t.Errorf("%s: rows_written of a claim = %d, want %d", b.Name, got, wantWritten)
		}
		if got := res[2].Meta.RowsWritten; got != 0 {
			t.Errorf("rows_written of a conflicting claim = %d, want 0", got)
		}

		// A read changes nothing.
		r := exec(t, c, d1client.Statement{SQL: "SELECT count(*) FROM idempotency_keys"})[0]
		if r.Meta.Changes != 0 || r.Meta.ChangedDB || r.Meta.RowsWritten != 0 {
			t.Errorf("read: meta %+v", r.Meta)
		}
	})
}
