package schema

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"unicode"

	"github.com/d1idem/d1idem"
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

// statements splits sql into its statements, each a list of normalized
// tokens, without empty statements or IF NOT EXISTS after CREATE TABLE or
// CREATE INDEX.
func statements(sql string) [][]string {
	var out [][]string
	var cur []string
	flush := func() {
		if len(cur) >= 5 && cur[0] == "create" && (cur[1] == "table" || cur[1] == "index") && cur[2] == "if" && cur[3] == "not" && cur[4] == "exists" {
			cur = append(cur[:2], cur[5:]...)
		}
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur = nil
	}
	for _, t := range tokens(sql) {
		if t == ";" {
			flush()
		} else {
			cur = append(cur, t)
		}
	}
	flush()
	return out
}

// tokens splits sql into SQLite tokens, dropping whitespace and comments:
// words (keywords, identifiers, numbers; quoted identifiers unquoted) in
// lower case, string literals verbatim, and every other character alone.
func tokens(sql string) []string {
	var out []string
	r := []rune(sql)
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case unicode.IsSpace(c) || c == '\ufeff':
			i++
		case c == '-' && i+1 < len(r) && r[i+1] == '-':
			for i < len(r) && r[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(r) && r[i+1] == '*':
			i += 2
			for i < len(r) && !(r[i] == '*' && i+1 < len(r) && r[i+1] == '/') {
				i++
			}
			i += 2
		case c == '\'':
			s, n := quoted(r[i:], '\'')
			out = append(out, "'"+s+"'")
			i += n
		case c == '"' || c == '`' || c == '[':
			end := c
			if c == '[' {
				end = ']'
			}
			s, n := quoted(r[i:], end)
			out = append(out, strings.ToLower(s))
			i += n
		case isWord(c):
			j := i
			for j < len(r) && isWord(r[j]) {
				j++
			}
			out = append(out, strings.ToLower(string(r[i:j])))
			i = j
		default:
			out = append(out, string(c))
			i++
		}
	}
	return out
}

// quoted reads the quoted text at the start of r (r[0] is the opening
// quote), with a doubled end quote standing for itself. It returns the text
// and the number of runes read.
func quoted(r []rune, end rune) (string, int) {
	var b strings.Builder
	i := 1
	for i < len(r) {
		if r[i] == end {
			if end != ']' && i+1 < len(r) && r[i+1] == end {
				b.WriteRune(end)
				i += 2
				continue
			}
			return b.String(), i + 1
		}
		b.WriteRune(r[i])
		i++
	}
	return b.String(), i
}

func isWord(c rune) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c > unicode.MaxASCII && !unicode.IsSpace(c)
}
