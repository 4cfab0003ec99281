package d1local

import (
	"slices"
	"testing"
)

func TestSplitSQL(t *testing.T) {
	tests := []struct {
		name     string
		sql      string
		want     []string
		keywords []string
	}{
		{"empty", "", nil, nil},
		{"one with semicolon", " SELECT 1 ; ", []string{"SELECT 1"}, []string{"SELECT"}},
		{"two", "SELECT 1; select 2;", []string{"SELECT 1", "select 2"}, []string{"SELECT", "SELECT"}},
		{"trigger body", "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END; SELECT 1",
			[]string{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END", "SELECT 1"},
			[]string{"CREATE", "SELECT"}},
		{"explain create trigger", "EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; SELECT 2",
			[]string{"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", "SELECT 2"}, []string{"EXPLAIN", "SELECT"}},
		{"leading comment keyword", "/* c */ -- d\n  begin; commit", []string{"/* c */ -- d\n  begin", "commit"}, []string{"BEGIN", "COMMIT"}},
		{"byte order mark", "\ufeffselect 1", []string{"\ufeffselect 1"}, []string{"SELECT"}},
		{"parenthesis first", "(SELECT 1); VALUES (2)", []string{"(SELECT 1)", "VALUES (2)"}, []string{"", "VALUES"}},
		{"quoted first", `"a"; 'b'`, []string{`"a"`, `'b'`}, []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pieces, _ := splitSQL(tt.sql)
			var got, keywords []string
			for _, p := range pieces {
				got = append(got, p.sql)
				keywords = append(keywords, p.keyword)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("splitSQL(%q) = %q, want %q", tt.sql, got, tt.want)
			}
			if !slices.Equal(keywords, tt.keywords) {
				t.Errorf("keywords = %q, want %q", keywords, tt.keywords)
			}
		})
	}
}

// TestSplitSQLEmptyTail: what follows the last statement's ';' must be
// whitespace or another statement, as workerd requires (verified on
// workerd by conformance.TestEmptyStatements).
func TestSplitSQLEmptyTail(t *testing.T) {
	for sql, want := range map[string]bool{
		"SELECT 1;;":           true,
		"SELECT 1; ;":          true,
		"SELECT 1; -- note":    true,
		"SELECT 1;\n-- note\n": true,
		"SELECT 1; /* c */":    true,
		"SELECT 1;/**/":        true,
		"SELECT 1;SELECT 2;;":  true,
		"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END;;": true,
		"SELECT 1":             false,
		"SELECT 1;":            false,
		"SELECT 1;\r\n\t\f\v ": false,
		"SELECT 1 -- note":     false,
		"SELECT 1 /* c */;":    false,
		";SELECT 1":            false,
		"/* c */;SELECT 1":     false,
		"SELECT 1;;SELECT 2":   false,
		"SELECT 1;;SELECT 2;":  false,
		"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END;": false,
		"":   false,
		";;": false, // no statement at all: a different error
	} {
		if _, got := splitSQL(sql); got != want {
			t.Errorf("splitSQL(%q) emptyTail = %v, want %v", sql, got, want)
		}
	}
}
