package sqlite

import (
	"slices"
	"strings"
	"testing"
)

// TestNext: each kind of token, and where it ends, as SQLite's tokenizer
// has it.
func TestNext(t *testing.T) {
	for _, tc := range []struct {
		sql, text string
		kind      Kind
	}{
		{" \t\r\n\f\v x", " \t\r\n\f\v ", Space},
		{"\vx", "\v", Illegal}, // '\v' continues a run of whitespace, never starts one
		{"-- a; b\nc", "-- a; b", Comment},
		{"-- a; b", "-- a; b", Comment},
		{"/* a; b */c", "/* a; b */", Comment},
		{"/**/c", "/**/", Comment},
		{"/*/ c", "/*/ c", Comment}, // unterminated: runs to the end
		{"/* ", "/* ", Comment},
		{"/*", "/", Operator}, // SQLite reads "/*" at the end as '/' and '*'
		{"\ufeffSELECT", "\ufeff", Comment},
		{"select x", "select", Word},
		{"_a$1 x", "_a$1", Word},
		{"é;", "é", Word},
		{"\xef\xbbx", "\xef\xbbx", Word}, // not a byte order mark
		{"'it''s;' x", "'it''s;'", String},
		{"'abc", "'abc", Illegal},
		{`"a""b" x`, `"a""b"`, QuotedID},
		{"`a;b` x", "`a;b`", QuotedID},
		{"[a;b]] x", "[a;b]", QuotedID},
		{"[a;b", "[a;b", Illegal},
		{"x'3b3B' y", "x'3b3B'", Blob},
		{"X'' y", "X''", Blob},
		{"x'3' y", "x'3'", Illegal},
		{"x'3g' y", "x'3g'", Illegal},
		{"x'3", "x'3", Illegal},
		{"xy", "xy", Word},
		{"1.5e-3+", "1.5e-3", Number},
		{".5,", ".5", Number},
		{"1_000 ", "1_000", Number},
		{"0x1F_ff ", "0x1F_ff", Number},
		{"1e+1", "1e+1", Number},
		{"1e+", "1e", Illegal},
		{"1abc ", "1abc", Illegal},
		{"0xg", "0xg", Illegal},
		{"?12,", "?12", Variable},
		{"? ", "?", Variable},
		{":a,", ":a", Variable},
		{"@b;", "@b", Variable},
		{"#c ", "#c", Variable},
		{"$d::e::f,", "$d::e::f", Variable},
		{"$a(x;y) z", "$a(x;y)", Variable},
		{"$a(x y)", "$a(x", Illegal},
		{"$ ", "$", Illegal},
		{";;", ";", Semicolon},
		{"((", "(", LParen},
		{"))", ")", RParen},
		{"->>'a'", "->>", Operator},
		{"->'a'", "->", Operator},
		{"- 1", "-", Operator},
		{"||x", "||", Operator},
		{"<>x", "<>", Operator},
		{"<=x", "<=", Operator},
		{"<<x", "<<", Operator},
		{">=x", ">=", Operator},
		{">>x", ">>", Operator},
		{"==x", "==", Operator},
		{"!=x", "!=", Operator},
		{"!x", "!", Illegal},
		{".a", ".", Operator},
		{"^", "^", Illegal},
		{"\x00;", "\x00", Illegal},
	} {
		if got := Next(tc.sql); got.Text != tc.text || got.Kind != tc.kind {
			t.Errorf("Next(%q) = %q (kind %d), want %q (kind %d)", tc.sql, got.Text, got.Kind, tc.text, tc.kind)
		}
	}
}

func TestTokens(t *testing.T) {
	var got []string
	for tok := range Tokens("SELECT/* c */a -- d\n,'x'") {
		got = append(got, tok.Text)
	}
	if want := []string{"SELECT", "a", ",", "'x'"}; !slices.Equal(got, want) {
		t.Errorf("Tokens = %q, want %q", got, want)
	}
	for range Tokens("a b c") {
		break // stopping early does not panic
	}
}

func TestKeywordAndUnquoted(t *testing.T) {
	for _, tc := range []struct{ sql, keyword, unquoted string }{
		{"select", "SELECT", "select"},
		{"'it''s'", "", "it's"},
		{`"a""b"`, "", `a"b`},
		{"`a``b`", "", "a`b"},
		{"[a]]", "", "a"},
		{"x'00'", "", "x'00'"},
		{"'unterminated", "", "'unterminated"},
	} {
		tok := Next(tc.sql)
		if got := tok.Keyword(); got != tc.keyword {
			t.Errorf("Next(%q).Keyword() = %q, want %q", tc.sql, got, tc.keyword)
		}
		if got := tok.Unquoted(); got != tc.unquoted {
			t.Errorf("Next(%q).Unquoted() = %q, want %q", tc.sql, got, tc.unquoted)
		}
	}
}

// splitTests are the texts TestSplit splits, with the statements SQLite
// finds in them; FuzzSplit starts from them.
var splitTests = []struct {
	sql  string
	want []string
}{
	{"", nil},
	{" ; ;\n", nil},
	{"-- a; b\n/* c; d */", nil},
	{";; -- nothing\n /* at all */", nil},
	{"\ufeff", nil},
	{"SELECT 1", []string{"SELECT 1"}},
	{" SELECT 1 ; ", []string{"SELECT 1"}},
	{"SELECT 1; select 2;", []string{"SELECT 1", "select 2"}},
	{"SELECT 1;;", []string{"SELECT 1"}},
	{";SELECT 1;;SELECT 2", []string{"SELECT 1", "SELECT 2"}},
	{`SELECT ';', "a;b", [c;d], ` + "`e;f`" + `, 'it''s;', x'3b'; SELECT 2`,
		[]string{`SELECT ';', "a;b", [c;d], ` + "`e;f`" + `, 'it''s;', x'3b'`, "SELECT 2"}},
	{"SELECT 1 -- x; y\n; /* ; */ SELECT 2", []string{"SELECT 1 -- x; y", "/* ; */ SELECT 2"}},
	{"/* c */ -- d\n  begin; commit", []string{"/* c */ -- d\n  begin", "commit"}},
	{"SELECT 1 /* ; SELECT 2", []string{"SELECT 1 /* ; SELECT 2"}},
	{"SELECT 1 /* ", []string{"SELECT 1 /* "}}, // an unterminated comment keeps its space
	{"SELECT 1; /*", []string{"SELECT 1", "/*"}},
	{"SELECT $a(x;y) FROM t; SELECT 2", []string{"SELECT $a(x;y) FROM t", "SELECT 2"}},
	{"SELECT 'abc; SELECT 2", []string{"SELECT 'abc; SELECT 2"}},
	{"SELECT [abc; SELECT 2", []string{"SELECT [abc; SELECT 2"}},
	{"SELECT 1\x00; DELETE FROM t", []string{"SELECT 1\x00", "DELETE FROM t"}},
	{"SELECT 1;\v", []string{"SELECT 1", "\v"}},
	{"SELECT 1;\r\n\t\f\v ", []string{"SELECT 1"}},
	{"(SELECT 1); VALUES (2)", []string{"(SELECT 1)", "VALUES (2)"}},
	{"SELECT 1 AS é; SELECT 2", []string{"SELECT 1 AS é", "SELECT 2"}},
	{"\ufeffSELECT 1;\ufeff", []string{"\ufeffSELECT 1"}},
	{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END; SELECT 1",
		[]string{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO a VALUES (1); UPDATE b SET x = 1; END", "SELECT 1"}},
	{"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = CASE WHEN 1 THEN 2 END; END;INSERT INTO t VALUES (1)",
		[]string{"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = CASE WHEN 1 THEN 2 END; END", "INSERT INTO t VALUES (1)"}},
	{"create temporary trigger if not exists tr after insert on t begin select 1;end;select 2",
		[]string{"create temporary trigger if not exists tr after insert on t begin select 1;end", "select 2"}},
	{"CREATE TRIGGER tr AFTER INSERT ON t\r\nBEGIN\r\n  DELETE FROM a;\r\nEND;\r\nSELECT 1;\r\n",
		[]string{"CREATE TRIGGER tr AFTER INSERT ON t\r\nBEGIN\r\n  DELETE FROM a;\r\nEND", "SELECT 1"}},
	{"CREATE /* ; */ TRIGGER tr AFTER INSERT ON t BEGIN SELECT 'END;'; END; SELECT 2",
		[]string{"CREATE /* ; */ TRIGGER tr AFTER INSERT ON t BEGIN SELECT 'END;'; END", "SELECT 2"}},
	{"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; SELECT 2",
		[]string{"EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", "SELECT 2"}},
	{"EXPLAIN QUERY PLAN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; SELECT 2",
		[]string{"EXPLAIN QUERY PLAN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", "SELECT 2"}},
	{"CREATE TABLE triggers (a); SELECT 1", []string{"CREATE TABLE triggers (a)", "SELECT 1"}},
	{`CREATE TABLE "trigger" ("end"); SELECT 1`, []string{`CREATE TABLE "trigger" ("end")`, "SELECT 1"}},
	{"CREATE TEMP TABLE x (a); END; SELECT 1", []string{"CREATE TEMP TABLE x (a)", "END", "SELECT 1"}},
	{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1;", []string{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1;"}},
}

func TestSplit(t *testing.T) {
	for _, tc := range splitTests {
		var got []string
		for _, st := range Split(tc.sql) {
			got = append(got, st.SQL)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Split(%q) = %q, want %q", tc.sql, got, tc.want)
		}
		checkSplit(t, tc.sql)
	}
}

// checkSplit checks what Split guarantees of any text: each statement's
// SQL is its part of the text up to its End, without the whitespace around
// it and the ';' ending it, and reads alone as the same tokens and one
// statement; between statements there are only whitespace, comments and
// semicolons.
func checkSplit(t *testing.T, sql string) {
	t.Helper()
	all := tokensAt(t, sql)
	prev := 0
	for _, st := range Split(sql) {
		checkSplitStatement(t, sql, all, prev, st)
		prev = st.End
	}
	for _, tok := range all {
		if tok.at >= prev && tok.Kind > Comment && tok.Kind != Semicolon {
			t.Fatalf("%q: %q after the last statement", sql, tok.Text)
		}
	}
}

// posToken is a token of a text, and where it starts in it.
type posToken struct {
	Token
	at int
}

// tokensAt reads sql as tokens, each with its offset.
func tokensAt(t *testing.T, sql string) []posToken {
	t.Helper()
	var all []posToken
	for i := 0; i < len(sql); {
		tok := Next(sql[i:])
		if tok.Text == "" {
			t.Fatalf("%q: an empty token at %d", sql, i)
		}
		all = append(all, posToken{tok, i})
		i += len(tok.Text)
	}
	return all
}

// checkSplitStatement checks checkSplit's guarantees for statement st of
// sql (whose tokens are all), the statement before it having ended at
// prev.
func checkSplitStatement(t *testing.T, sql string, all []posToken, prev int, st Statement) {
	t.Helper()
	if st.End <= prev || st.End > len(sql) || st.End < len(sql) && sql[st.End-1] != ';' {
		t.Fatalf("%q: a statement ends at %d, after one that ended at %d", sql, st.End, prev)
	}
	from := prev + strings.LastIndex(sql[prev:st.End], st.SQL)
	to := from + len(st.SQL)
	if st.SQL == "" || from < prev {
		t.Fatalf("%q: statement %q is not in its part of the text, %q", sql, st.SQL, sql[prev:st.End])
	}
	var inside []Token
	for _, tok := range all {
		end := tok.at + len(tok.Text)
		switch {
		case tok.at >= from && end <= to:
			if tok.Kind > Comment {
				inside = append(inside, tok.Token)
			}
		case end > prev && tok.at < from:
			if tok.Kind > Comment && tok.Kind != Semicolon {
				t.Fatalf("%q: %q before statement %q", sql, tok.Text, st.SQL)
			}
		case end > to && tok.at < st.End:
			if tok.Kind != Space && !(tok.Kind == Semicolon && end == st.End) {
				t.Fatalf("%q: %q after statement %q", sql, tok.Text, st.SQL)
			}
		}
	}
	if !slices.ContainsFunc(inside, func(t Token) bool { return t.Kind != Semicolon }) {
		t.Fatalf("%q: statement %q holds no token but whitespace, comments and ';'", sql, st.SQL)
	}
	if !slices.Equal(slices.Collect(Tokens(st.SQL)), inside) {
		t.Fatalf("%q: statement %q reads alone as other tokens", sql, st.SQL)
	}
	if again := Split(st.SQL); len(again) != 1 || again[0] != (Statement{st.SQL, len(st.SQL)}) {
		t.Fatalf("%q: statement %q splits alone as %+v", sql, st.SQL, again)
	}
}
