package d1local

import (
	"math"
	"strconv"
	"strings"
)

// jsNumber formats f the way JavaScript's Number.prototype.toString() does
// (ECMAScript Number::toString with radix 10), which is also how
// JSON.stringify writes a finite number: the shortest digits that read back
// as f, in plain notation for decimal exponents from -6 to 20 and in
// exponent notation ("1e+21", "1.5e-7") outside it. -0 formats as "0".
// NaN and the infinities give "NaN", "Infinity" and "-Infinity", which are
// not JSON: callers write null for them, as JSON.stringify does.
func jsNumber(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0:
		return "0"
	case f < 0:
		return "-" + jsNumber(-f)
	}
	// The shortest round-trip digits, as "d.ddde±x": s has k digits and the
	// value is 0.s × 10^n.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1

	var b strings.Builder
	switch {
	case k <= n && n <= 21:
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", n-k))
	case 0 < n && n <= 21:
		b.WriteString(digits[:n])
		b.WriteByte('.')
		b.WriteString(digits[n:])
	case -6 < n && n <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -n))
		b.WriteString(digits)
	default:
		b.WriteByte(digits[0])
		if k > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		b.WriteByte('e')
		if n-1 >= 0 {
			b.WriteByte('+')
		}
		b.WriteString(strconv.Itoa(n - 1))
	}
	return b.String()
}

// maxSafeInteger is 2^53, beyond which not every integer is a float64.
const maxSafeInteger = 1 << 53
