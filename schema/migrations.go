package schema

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// WriteMigration makes wrangler's migrations directory dir hold the
// schema. When a .sql file there already does (see FindMigrations), it
// returns that file's name and written false. Otherwise it writes
// schema.sql there as the next migration, named as `wrangler d1 migrations
// create` names it (one past the highest leading number of the .sql
// files, four digits, then _d1idem_idempotency_keys.sql), creating dir if
// needed, and returns its name and written true. It never overwrites a
// file.
func WriteMigration(dir string) (name string, written bool, err error) {
	existing, err := FindMigrations(os.DirFS(dir))
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", dir, err)
	}
	if len(existing) > 0 {
		return existing[0], false, nil
	}
	if name, err = nextMigrationName(dir); err != nil {
		return "", false, fmt.Errorf("reading %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", false, err
	}
	_, err = f.WriteString(d1idem.Schema())
	if err := errors.Join(err, f.Close()); err != nil {
		return "", false, fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	return name, true, nil
}

// nextMigrationName is the name `wrangler d1 migrations create` gives the
// ledger's migration in dir: the highest leading number of the .sql files
// there plus one, four digits wide, then _d1idem_idempotency_keys.sql. A
// missing dir counts as empty.
func nextMigrationName(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	highest := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, _, _ := strings.Cut(e.Name(), "_")
		if i := strings.IndexFunc(num, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			num = num[:i] // parseInt("0002abc") is 2
		}
		if n, err := strconv.Atoi(num); err == nil && n > highest {
			highest = n
		}
	}
	return fmt.Sprintf("%04d_d1idem_idempotency_keys.sql", highest+1), nil
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
