package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// printTable writes an aligned table: a header row, then the rows.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// printJSON writes v as indented JSON with a trailing newline.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// printFields writes label/value pairs as two aligned columns. A value with
// several lines continues under its first line.
func printFields(w io.Writer, fields [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fields {
		lines := strings.Split(f[1], "\n")
		fmt.Fprintf(tw, "%s\t%s\n", f[0], lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "\t%s\n", l)
		}
	}
	return tw.Flush()
}

// utcLayout is how absolute times are shown: UTC, milliseconds, RFC 3339.
const utcLayout = "2006-01-02T15:04:05.000Z"

// formatUTC formats a ledger timestamp (Unix milliseconds) in UTC.
func formatUTC(ms int64) string { return time.UnixMilli(ms).UTC().Format(utcLayout) }

// formatDuration is a short human duration: "850ms", "42s", "5m", "12m3s",
// "5h7m", "24h", "3d4h".
func formatDuration(d time.Duration) string {
	if d < 0 {
		return "-" + formatDuration(-d)
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour-time.Second/2:
		d = d.Round(time.Second)
	case d < 72*time.Hour-time.Minute/2:
		d = d.Round(time.Minute)
	default:
		d = d.Round(time.Hour)
		days, hours := d/(24*time.Hour), (d%(24*time.Hour))/time.Hour
		if hours == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, hours)
	}
	return durationArg(d) // "1h30m", "1h", "12m", "12m30s"
}

// formatAge says how long ago a timestamp was: "12m3s ago". A timestamp in
// the future (clock skew between writers) says so.
func formatAge(d time.Duration) string {
	if d < 0 {
		return formatDuration(-d) + " in the future"
	}
	return formatDuration(d) + " ago"
}

// display makes a ledger value safe to show in a table: a value with
// characters that are not printable ASCII, or with spaces at its edges, is
// shown Go-quoted, so that what is shown can be pasted back.
func display(s string) string {
	if s == "" {
		return `""`
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return strconv.Quote(s)
		}
	}
	if s[0] == ' ' || s[len(s)-1] == ' ' {
		return strconv.Quote(s)
	}
	return s
}

// shellQuote quotes s for a POSIX shell, for command lines that hints print.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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
