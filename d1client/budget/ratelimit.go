package budget

import (
	"strconv"
	"strings"
	"time"
)

// rateLimit and ratePolicy are members of the Ratelimit and
// Ratelimit-Policy headers (IETF ratelimit-headers draft):
// `"default";r=50;t=30`, 50 calls left and a reset in 30 s, and
// `"burst";q=100;w=60`, a quota of 100 calls per 60 s window.
type (
	rateLimit struct {
		name      string
		remaining int
		reset     time.Duration
	}
	ratePolicy struct {
		name   string
		quota  int
		window time.Duration
	}
)

// maxRateWindow bounds the reset time and the window the headers give: no
// API limit has a longer window, and 15 digits would overflow a Duration.
const maxRateWindow = 24 * time.Hour

// seconds returns n seconds, at most maxRateWindow (bounded before the
// multiplication, so that it cannot overflow).
func seconds(n int64) time.Duration {
	return time.Duration(min(n, int64(maxRateWindow/time.Second))) * time.Second
}

// parseRateLimit reads the Ratelimit header's field lines and returns the
// most constraining limit: the fewest calls remaining, then the latest
// reset. Members it cannot read are ignored; ok is false when none can be.
func parseRateLimit(lines []string) (best rateLimit, ok bool) {
	sfMembers(lines, "r", "t", func(name string, r, t int64) {
		lim := rateLimit{name, int(r), seconds(t)}
		if !ok || lim.remaining < best.remaining || lim.remaining == best.remaining && lim.reset > best.reset {
			best, ok = lim, true
		}
	})
	return best, ok
}

// parseRatePolicy reads the Ratelimit-Policy header's field lines and
// returns the policy named name, or else the first one it can read (q and
// w positive integers).
func parseRatePolicy(lines []string, name string) (pol ratePolicy, ok bool) {
	sfMembers(lines, "q", "w", func(n string, q, w int64) {
		if q > 0 && w > 0 && (!ok || n == name && name != "" && pol.name != name) {
			pol, ok = ratePolicy{n, int(q), seconds(w)}, true
		}
	})
	return pol, ok
}

// sfMembers calls fn with each member of structured-field list lines (split
// at commas outside quoted strings) that reads whole with integer a and b.
func sfMembers(lines []string, a, b string, fn func(name string, va, vb int64)) {
	for _, line := range lines {
		start, quoted := 0, false
		for i := 0; i <= len(line); i++ {
			switch {
			case i == len(line) || line[i] == ',' && !quoted:
				if name, va, vb, ok := sfMember(line[start:i], a, b); ok && va >= 0 && vb >= 0 {
					fn(name, va, vb)
				}
				start = i + 1
			case line[i] == '\\' && quoted && i+1 < len(line):
				i++
			case line[i] == '"':
				quoted = !quoted
			}
		}
	}
}

// sfMember reads one list member, `"name";key=value;key`, a string or a
// token then parameters, white space allowed around ';' and '='. It returns
// the name and the values of keys a and b (the last of repeated keys; -1
// unless a non-negative integer of at most 15 digits), ok false if malformed.
func sfMember(m, a, b string) (name string, va, vb int64, ok bool) {
	s := strings.TrimSpace(m)
	var rest string
	if strings.HasPrefix(s, `"`) {
		name, rest, ok = sfString(s)
	} else {
		name, _, _ = strings.Cut(s, ";")
		name, rest = strings.TrimSpace(name), s[len(name):]
		ok = sfWord(name, &tokenStart, &tokenChars)
	}
	rest = strings.TrimSpace(rest)
	if !ok || rest != "" && rest[0] != ';' {
		return "", 0, 0, false
	}
	va, vb = -1, -1
	if rest == "" {
		return name, va, vb, true
	}
	for p := range strings.SplitSeq(rest[1:], ";") {
		key, value, hasValue := strings.Cut(p, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !sfWord(key, &keyStart, &keyChars) || hasValue && value == "" {
			return "", 0, 0, false
		}
		switch key {
		case a:
			va = sfInt(value)
		case b:
			vb = sfInt(value)
		}
	}
	return name, va, vb, true
}

const (
	lower  = "abcdefghijklmnopqrstuvwxyz"
	alpha  = lower + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	digits = "0123456789"
)

// The bytes that may start and continue a token and a parameter key.
var (
	tokenStart, tokenChars = chars(alpha + "*"), chars(alpha + digits + "!#$%&'*+-.^_`|~:/")
	keyStart, keyChars     = chars(lower + "*"), chars(lower + digits + "_-.*")
)

type charSet [256]bool

func chars(s string) (c charSet) {
	for i := range len(s) {
		c[s[i]] = true
	}
	return c
}

// sfWord reports whether s is a byte of start, then bytes of rest.
func sfWord(s string, start, rest *charSet) bool {
	ok := s != "" && start[s[0]]
	for i := 1; ok && i < len(s); i++ {
		ok = rest[s[i]]
	}
	return ok
}

// sfInt returns v as a non-negative integer of at most 15 digits, or -1.
func sfInt(v string) int64 {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || len(v) > 15 {
		return -1
	}
	return int64(n)
}

// sfString reads the quoted string at the start of s: its value, and what follows.
func sfString(s string) (value, rest string, ok bool) {
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			if value = s[1:i]; strings.IndexByte(value, '\\') >= 0 {
				value = unescape.Replace(value)
			}
			return value, s[i+1:], true
		case c == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\'):
			i++
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", "", false
		}
	}
	return "", "", false
}

var unescape = strings.NewReplacer(`\"`, `"`, `\\`, `\`)
