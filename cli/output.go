package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// printTable writes an aligned table: a header row, then the rows. Each
// cell is escaped (escapeText): a tab or a control character in a value
// neither breaks the columns nor reaches the terminal.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, cell := range r {
			cells[i] = escapeText(cell)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// printJSON writes v as indented JSON with a trailing newline.
func printJSON(w io.Writer, v any) error { return writeJSON(w, v, "  ") }

// writeJSON writes v as JSON with a trailing newline, indented by indent
// ("": on one line), with no control character raw (jsonSafe).
func writeJSON(w io.Writer, v any, indent string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", indent)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonSafe(b.Bytes()))
	return err
}

// printFields writes label/value pairs as two aligned columns. A value with
// several lines continues under its first line. Each line is escaped
// (escapeText), as printTable's cells are.
func printFields(w io.Writer, fields [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fields {
		lines := strings.Split(f[1], "\n")
		fmt.Fprintf(tw, "%s\t%s\n", escapeText(f[0]), escapeText(lines[0]))
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "\t%s\n", escapeText(l))
		}
	}
	return tw.Flush()
}

// preview returns the first max bytes of s, cut at a character boundary,
// and how many bytes were left out.
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

// formatBytes is a byte count with its binary-prefixed size: "45056 bytes (44.0 KiB)".
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d bytes (%.1f GiB)", n, float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d bytes (%.1f MiB)", n, float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d bytes (%.1f KiB)", n, float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// plural is "1 row", "2 rows".
func plural(n int64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
