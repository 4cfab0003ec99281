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
		{"only semicolons and space", " ; ;\n", nil, nil},
		{"only comments", "-- a; b\n/* c; d */", nil, nil},
		{"one without semicolon", "SELECT 1", []string{"SELECT 1"}, []string{"SELECT"}},
		{"one with semicolon", " SELECT 1 ; ", []string{"SELECT 1"}, []string{"SELECT"}},
		{"two", "SELECT 1; select 2;", []string{"SELECT 1", "select 2"}, []string{"SELECT", "SELECT"}},
		{"semicolon in strings and identifiers", `SELECT ';', "a;b", [c;d], ` + "`e;f`" + `, 'it''s;'; SELECT 2`,
			[]string{`SELECT ';', "a;b", [c;d], ` + "`e;f`" + `, 'it''s;'`, "SELECT 2"}, []string{"SELECT", "SELECT"}},
		{"semicolon in comments", "SELECT 1 -- x; y\n; /* ; */ SELECT 2",
			[]string{"SELECT 1 -- x; y", "/* ; */ SELECT 2"}, []string{"SELECT", "SELECT"}},
		{"trigger body", "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END; SELECT 1",
			[]string{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END", "SELECT 1"},
			[]string{"CREATE", "SELECT"}},
		{"temp trigger with CASE ... END", "CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = CASE WHEN 1 THEN 2 END; END;INSERT INTO t VALUES (1)",
			[]string{"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = CASE WHEN 1 THEN 2 END; END", "INSERT INTO t VALUES (1)"},
			[]string{"CREATE", "INSERT"}},
		{"trigger with CRLF", "CREATE TRIGGER tr AFTER INSERT ON t\r\nBEGIN\r\n  DELETE FROM a;\r\nEND;\r\nSELECT 1;\r\n",
			[]string{"CREATE TRIGGER tr AFTER INSERT ON t\r\nBEGIN\r\n  DELETE FROM a;\r\nEND", "SELECT 1"}, []string{"CREATE", "SELECT"}},
		{"explain create trigger", "EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; SELECT 2",
			[]string{"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", "SELECT 2"}, []string{"EXPLAIN", "SELECT"}},
		{"create table named trigger-ish", "CREATE TABLE triggers (a); SELECT 1",
			[]string{"CREATE TABLE triggers (a)", "SELECT 1"}, []string{"CREATE", "SELECT"}},
		{"leading comment keyword", "/* c */ -- d\n  begin; commit", []string{"/* c */ -- d\n  begin", "commit"}, []string{"BEGIN", "COMMIT"}},
		{"unterminated string", "SELECT 'abc; SELECT 2", []string{"SELECT 'abc; SELECT 2"}, []string{"SELECT"}},
		{"unterminated trigger", "CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1;", []string{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1;"}, []string{"CREATE"}},
		{"parenthesis first", "(SELECT 1); VALUES (2)", []string{"(SELECT 1)", "VALUES (2)"}, []string{"", "VALUES"}},
		{"unicode identifiers", "SELECT 1 AS é; SELECT 2", []string{"SELECT 1 AS é", "SELECT 2"}, []string{"SELECT", "SELECT"}},
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
