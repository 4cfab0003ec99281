// Package human writes durations, ages, times, sizes and counts for
// people: the one way the ledger's explanations (idem.Explanation), the
// d1idem command line and the console spell them. It imports nothing of this module.
package human

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// TimeLayout is how absolute times are shown: UTC, to the millisecond,
// RFC 3339.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Time formats t in UTC as TimeLayout: "2026-03-01T02:47:57.000Z".
func Time(t time.Time) string { return t.UTC().Format(TimeLayout) }

// Duration is a short duration: "850ms", "42s", "5m", "12m3s", "5h7m",
// "24h", "3d4h". It rounds to the millisecond under a second, to the second
// under an hour, to the minute under three days, and to the hour above.
func Duration(d time.Duration) string {
	if d < 0 {
		return "-" + Duration(-d)
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
	return Arg(d)
}

// Arg is a duration as a command-line flag takes it back, without zero
// units at its end: "72h", "1m30s", "12m".
func Arg(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Age says how long ago something was, d before now: "12m3s ago". A time
// in the future (clock skew between writers) says so.
func Age(d time.Duration) string {
	if d < 0 {
		return Duration(-d) + " in the future"
	}
	return Duration(d) + " ago"
}

// Bytes is a byte count with its size in binary units: "45056 bytes (44.0
// KiB)".
func Bytes(n int64) string {
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

// Size is a size with a decimal prefix, as D1's limits are stated: "812
// bytes", "1.5 kB", "9.8 GB".
func Size(n float64) string {
	for _, u := range []struct {
		size float64
		name string
	}{{1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if n >= u.size {
			return fmt.Sprintf("%.1f %s", n/u.size, u.name)
		}
	}
	return Plural(int64(math.Round(n)), "byte", "bytes")
}

// Count writes n with thousands separators: "1,200", "-1,000,000".
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// Plural is a count with its noun: "1 row", "1,200 rows".
func Plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return Count(n) + " " + many
}

// OrDash is *n, or "-" for nil: a response status not stored yet.
func OrDash(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}
