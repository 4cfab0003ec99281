package schema

import (
	"errors"
	"io/fs"
	"slices"
	"strings"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/internal/sqlite"
)

// IsMigration reports whether sql, the contents of a migration file, is the
// ledger schema: the statements of schema.sql and nothing else. Comments,
// whitespace, the letter case of keywords and identifiers, identifier quotes
// and IF NOT EXISTS do not matter; string literals must match exactly.
func IsMigration(sql []byte) bool {
	return slices.EqualFunc(statements(string(sql)), statements(d1idem.Schema()), slices.Equal[[]string])
}

// FindMigrations returns the names of the .sql files at the top of fsys, a
// wrangler migrations directory, that hold the ledger schema (see
// IsMigration), in wrangler's order. A directory that does not exist has none.
func FindMigrations(fsys fs.FS) ([]string, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") || e.IsDir() {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		if IsMigration(data) {
			names = append(names, e.Name())
		}
	}
	return names, nil // fs.ReadDir sorts by name, as wrangler does
}

// statements splits sql into its statements, each a list of its tokens
// other than whitespace and comments, without IF NOT EXISTS after CREATE
// TABLE or CREATE INDEX: words in lower case, quoted identifiers unquoted
// and in lower case, anything else verbatim.
func statements(sql string) [][]string {
	var out [][]string
	for _, st := range sqlite.Split(sql) {
		var toks []string
		for t := range sqlite.Tokens(st.SQL) {
			switch t.Kind {
			case sqlite.Word, sqlite.QuotedID:
				toks = append(toks, strings.ToLower(t.Unquoted()))
			default:
				toks = append(toks, t.Text)
			}
		}
		if len(toks) >= 5 && toks[0] == "create" && (toks[1] == "table" || toks[1] == "index") && toks[2] == "if" && toks[3] == "not" && toks[4] == "exists" {
			toks = append(toks[:2], toks[5:]...)
		}
		out = append(out, toks)
	}
	return out
}
