package d1idem_test

import (
	"os"
	"strings"
	"testing"

	"github.com/d1idem/d1idem"
)

// schema.sql holds the spec's table and index verbatim
// (docs/contract.md#1-schema), checked against the spec's text when it is
// beside the checkout.
func TestSchemaIsTheSpecsVerbatim(t *testing.T) {
	spec, err := os.ReadFile("../shared/spec/idempotency-key-ledger-on-d1.txt")
	if err != nil {
		t.Skipf("the spec is not beside this checkout: %v", err)
	}
	stmts := d1idem.SchemaStatements()
	if len(stmts) != 2 {
		t.Fatalf("%d statements, want 2", len(stmts))
	}
	for _, s := range stmts {
		if !strings.Contains(string(spec), s+";") {
			t.Errorf("not verbatim in the spec:\n%s", s)
		}
	}
	if !strings.HasPrefix(stmts[0], "CREATE TABLE "+d1idem.Table+" (") || !strings.HasPrefix(stmts[1], "CREATE INDEX "+d1idem.UpdatedAtIndex+" ") {
		t.Errorf("unexpected statements: %q", stmts)
	}
	if d1idem.Schema() != strings.Join(stmts, ";\n\n")+";\n" {
		t.Error("SchemaStatements does not reassemble Schema")
	}
}

// docs/contract.md shows schema.sql verbatim, in the first sql block of its
// section 1.
func TestContractShowsTheSchema(t *testing.T) {
	md, err := os.ReadFile("docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(md), "\n## 1. Schema\n")
	if !ok {
		t.Fatal(`docs/contract.md has no "## 1. Schema" section`)
	}
	_, block, ok := strings.Cut(section, "```sql\n")
	if !ok {
		t.Fatal("docs/contract.md section 1 has no sql block")
	}
	block, _, _ = strings.Cut(block, "```")
	if block != d1idem.Schema() {
		t.Errorf("docs/contract.md section 1 is not schema.sql:\n%s", block)
	}
}
