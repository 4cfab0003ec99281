package human

import (
	"testing"
	"time"
)

// TestDuration: the short durations keep every digit; only a zero
// last unit is left out.
func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond:              "850ms",
		42 * time.Second:                    "42s",
		5 * time.Minute:                     "5m",
		10 * time.Minute:                    "10m",
		12*time.Minute + 3*time.Second:      "12m3s",
		2*time.Minute + 10*time.Second:      "2m10s",
		11*time.Minute + 30*time.Second:     "11m30s",
		20*time.Minute + 50*time.Second:     "20m50s",
		time.Hour:                           "1h",
		10 * time.Hour:                      "10h",
		time.Hour + 30*time.Minute:          "1h30m",
		2*time.Hour + 10*time.Minute:        "2h10m",
		5*time.Hour + 7*time.Minute:         "5h7m",
		24 * time.Hour:                      "24h",
		3*24*time.Hour + 4*time.Hour:        "3d4h",
		10 * 24 * time.Hour:                 "10d",
		-(time.Hour + 30*time.Minute):       "-1h30m",
		59*time.Minute + 59*time.Second + 1: "59m59s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
	if got := Age(20*time.Minute + 50*time.Second); got != "20m50s ago" {
		t.Errorf("Age = %q", got)
	}
}

func TestTime(t *testing.T) {
	if got := Time(time.Date(2026, 3, 1, 2, 47, 57, 0, time.FixedZone("X", 3600))); got != "2026-03-01T01:47:57.000Z" {
		t.Errorf("Time = %q", got)
	}
}

// TestSizes: byte counts in binary units, sizes in decimal ones (as D1
// states its limits).
func TestSizes(t *testing.T) {
	for n, want := range map[int64]string{812: "812 bytes", 45056: "45056 bytes (44.0 KiB)", 3 << 20: "3145728 bytes (3.0 MiB)", 5 << 30: "5368709120 bytes (5.0 GiB)"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[float64]string{812: "812 bytes", 1500: "1.5 kB", 24e6: "24.0 MB", 9.8e9: "9.8 GB"} {
		if got := Size(n); got != want {
			t.Errorf("Size(%v) = %q, want %q", n, got, want)
		}
	}
}

func TestCountAndPlural(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 1200: "1,200", 1234567: "1,234,567", -1000000: "-1,000,000"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 rows", 1: "1 row", 2: "2 rows", 1200: "1,200 rows"} {
		if got := Plural(n, "row", "rows"); got != want {
			t.Errorf("Plural(%d) = %q, want %q", n, got, want)
		}
	}
	status := int64(201)
	if OrDash(nil) != "-" || OrDash(&status) != "201" {
		t.Errorf("OrDash: %q, %q", OrDash(nil), OrDash(&status))
	}
}
