package d1local

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestJSNumber(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0"},
		{math.Copysign(0, -1), "0"},
		{1, "1"},
		{-1, "-1"},
		{42, "42"},
		{1.5, "1.5"},
		{-2.25, "-2.25"},
		{0.1, "0.1"},
		{add(0.1, 0.2), "0.30000000000000004"},
		{1.0 / 3, "0.3333333333333333"},
		{123.456, "123.456"},
		{100, "100"},
		{1e20, "100000000000000000000"},
		{123456789012345680000, "123456789012345680000"},
		{1e21, "1e+21"},
		{1.5e21, "1.5e+21"},
		{1e100, "1e+100"},
		{math.MaxFloat64, "1.7976931348623157e+308"},
		{0.000001, "0.000001"},
		{0.0000015, "0.0000015"},
		{1e-7, "1e-7"},
		{1.5e-7, "1.5e-7"},
		{-1e-7, "-1e-7"},
		{123e-20, "1.23e-18"},
		{5e-324, "5e-324"},
		{9007199254740992, "9007199254740992"},
		{9007199254740993, "9007199254740992"},
		{9223372036854775807, "9223372036854776000"},
		{-9223372036854775808, "-9223372036854776000"},
		{12345678901234567, "12345678901234568"},
		{4.35, "4.35"},
		{0.5, "0.5"},
		{1e6, "1000000"},
		{25e-5, "0.00025"},
		{math.NaN(), "NaN"},
		{math.Inf(1), "Infinity"},
		{math.Inf(-1), "-Infinity"},
	}
	for _, tt := range tests {
		if got := jsNumber(tt.in); got != tt.want {
			t.Errorf("jsNumber(%v) = %q, want %q", tt.in, got, tt.want)
		}
		want := tt.want
		if math.IsNaN(tt.in) || math.IsInf(tt.in, 0) {
			want = "null" // as JSON.stringify writes them
		}
		if got := string(appendJSNumber([]byte("x"), tt.in)); got != "x"+want {
			t.Errorf("appendJSNumber(%v) = %q, want %q", tt.in, got, "x"+want)
		}
	}
}

// appendJSNumber writes plain-notation numbers with strconv directly; it
// agrees with jsNumber everywhere: on random bit patterns, and next to the
// bounds of plain notation (1e-6 and 1e21) and of the shortest digits.
func TestAppendJSNumberAgreesWithJSNumber(t *testing.T) {
	check := func(f float64) {
		t.Helper()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return
		}
		if got, want := string(appendJSNumber(nil, f)), jsNumber(f); got != want {
			t.Fatalf("appendJSNumber(%v) = %q, jsNumber gives %q", f, got, want)
		}
	}
	for _, edge := range []float64{1e-6, 1e21, 1e-7, 1e20, 1, 0.1, 5e-324, math.MaxFloat64, 1 << 53} {
		for _, sign := range []float64{1, -1} {
			f := sign * edge
			check(f)
			check(math.Nextafter(f, 0))
			check(math.Nextafter(f, math.Inf(int(sign))))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		check(math.Float64frombits(r.Uint64())) // every exponent
		check(r.Float64() * math.Pow(10, float64(r.IntN(40)-12)))
		check(float64(r.Int64N(1<<60)) / float64(r.Int64N(1<<20)+1))
	}
}

// add adds at run time, where 0.1 + 0.2 is not the exact constant 0.3.
func add(a, b float64) float64 { return a + b }

func TestAppendJSInteger(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{-5, "-5"},
		{1 << 53, "9007199254740992"},
		{-(1 << 53), "-9007199254740992"},
		{1<<53 + 1, "9007199254740992"},
		{math.MaxInt64, "9223372036854776000"},
		{math.MinInt64, "-9223372036854776000"},
		{1<<62 + 12345, "4611686018427400000"},
	}
	for _, tt := range tests {
		if got := string(appendJSInteger(nil, tt.in)); got != tt.want {
			t.Errorf("appendJSInteger(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
