package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/d1idem/d1idem/internal/textsafe"
)

// printTable writes an aligned table: a header row, then the rows, each cell
// escaped (escapeText): a tab or control character breaks nothing.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, cell := range r {
			cells[i] = textsafe.Escape(cell)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// printJSON writes v as indented JSON with a trailing newline.
func printJSON(w io.Writer, v any) error { return writeJSON(w, v, "  ") }

// writeJSON writes v as JSON with a trailing newline, indented by indent
// ("": on one line), with no control character raw (textsafe.JSON).
func writeJSON(w io.Writer, v any, indent string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", indent)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(textsafe.JSON(b.Bytes()))
	return err
}

// printFields writes label/value pairs as two aligned columns, a value's
// lines one under another, each escaped as printTable's cells are.
func printFields(w io.Writer, fields [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fields {
		lines := strings.Split(f[1], "\n")
		fmt.Fprintf(tw, "%s\t%s\n", textsafe.Escape(f[0]), textsafe.Escape(lines[0]))
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "\t%s\n", textsafe.Escape(l))
		}
	}
	return tw.Flush()
}

// preview cuts s to max bytes at a character boundary, and says how many it left out.
func preview(s string, max int) (string, int) {
	if len(s) <= max {
		return s, 0
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], len(s) - cut
}

// field is a named value of a JSON object that object writes.
type field struct {
	name  string
	value any
}

// object is the JSON object of parts, in order: a field is one member, nil
// none, any other part an object (a library result) whose members are all
// taken: what only the command knows, added to what the library returns.
func object(parts ...any) (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for _, p := range parts {
		if p == nil {
			continue
		}
		if f, ok := p.(field); ok {
			p = map[string]any{f.name: f.value}
		}
		v, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		if len(v) < 2 || v[0] != '{' {
			return nil, fmt.Errorf("cli: %T is not a JSON object", p)
		}
		if inner := v[1 : len(v)-1]; len(inner) > 0 {
			if b.Len() > 1 {
				b.WriteByte(',')
			}
			b.Write(inner)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// printObject writes object(parts...) as printJSON does.
func printObject(w io.Writer, parts ...any) error {
	v, err := object(parts...)
	if err != nil {
		return err
	}
	return printJSON(w, v)
}

// maxCell bounds a ledger value in a table's cell, in characters: a long
// principal or key is cut, with an ellipsis, and shown whole by keys get.
const maxCell = 40

// cell is a ledger value in a table: shown as display shows it, cut to
// maxCell characters with an ellipsis at the end.
func cell(v string) string {
	s := textsafe.Display(v)
	if utf8.RuneCountInString(s) <= maxCell {
		return s
	}
	r := []rune(s)
	return string(r[:maxCell-1]) + "…"
}

// wrapWidth is where wrap breaks a long line of text.
const wrapWidth = 100

// wrap breaks text into lines of at most wrapWidth characters, at spaces;
// a longer word keeps a line of its own.
func wrap(text string) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(text) {
		w := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case n+1+w > wrapWidth:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += w
	}
	return b.String()
}
