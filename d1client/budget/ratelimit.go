package budget

import (
	"strconv"
	"strings"
	"time"
)

// rateLimit is one member of a Ratelimit header (IETF ratelimit-headers
// draft): `"default";r=50;t=30`, 50 calls remaining, the window resetting
// in 30 seconds.
type rateLimit struct {
	name      string
	remaining int
	reset     time.Duration
}

// ratePolicy is one member of a Ratelimit-Policy header: `"burst";q=100;w=60`,
// a quota of 100 calls per 60-second window.
type ratePolicy struct {
	name   string
	quota  int
	window time.Duration
}

// maxRateWindow bounds the reset time and the window the headers give: no
// API limit counts calls over a longer window, and a larger value (up to
// 15 digits are read) would overflow a time.Duration into the past.
const maxRateWindow = 24 * time.Hour

// seconds returns n seconds, at most maxRateWindow: bounded before the
// multiplication, so that it cannot overflow.
func seconds(n int64) time.Duration {
	return time.Duration(min(n, int64(maxRateWindow/time.Second))) * time.Second
}

// parseRateLimit reads the Ratelimit header's field lines and returns the
// most constraining limit: the fewest calls remaining. Members it cannot
// read (no r or t, a value that is not a non-negative integer, anything
// malformed) are ignored; ok is false when none can be read.
func parseRateLimit(lines []string) (best rateLimit, ok bool) {
	sfMembers(lines, func(m string) {
		var r, t sfInt
		name, good := parseSFMember(m, func(key, value string) {
			switch key {
			case "r":
				r.set(value)
			case "t":
				t.set(value)
			}
		})
		if !good || !r.ok || !t.ok {
			return
		}
		lim := rateLimit{name: name, remaining: int(r.n), reset: seconds(t.n)}
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
	named := false
	sfMembers(lines, func(m string) {
		var q, w sfInt
		n, good := parseSFMember(m, func(key, value string) {
			switch key {
			case "q":
				q.set(value)
			case "w":
				w.set(value)
			}
		})
		if !good || !q.ok || !w.ok || q.n == 0 || w.n == 0 || named {
			return
		}
		p := ratePolicy{name: n, quota: int(q.n), window: seconds(w.n)}
		if n == name && name != "" {
			pol, ok, named = p, true, true
		} else if !ok {
			pol, ok = p, true
		}
	})
	return pol, ok
}

// sfMembers calls fn with each member of structured-field list lines,
// split at commas outside quoted strings.
func sfMembers(lines []string, fn func(member string)) {
	for _, line := range lines {
		start, quoted := 0, false
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case c == '\\' && quoted:
				i++
			case c == '"':
				quoted = !quoted
			case c == ',' && !quoted:
				fn(line[start:i])
				start = i + 1
			}
		}
		fn(line[start:])
	}
}

// parseSFMember reads one list member: an item (a string or a token) and
// its parameters, `"name";key=value;key=value`, handing each parameter to
// param in order (so the last of repeated keys wins). It is lenient about
// white space around ';' and '='; ok is false for anything else.
func parseSFMember(m string, param func(key, value string)) (name string, ok bool) {
	s := strings.TrimSpace(m)
	if s == "" {
		return "", false
	}
	var rest string
	if s[0] == '"' {
		var good bool
		if name, rest, good = sfString(s); !good {
			return "", false
		}
	} else {
		i := strings.IndexByte(s, ';')
		if i < 0 {
			i = len(s)
		}
		name, rest = strings.TrimSpace(s[:i]), s[i:]
		if !sfToken(name) {
			return "", false
		}
	}
	type kv struct{ k, v string }
	var params [8]kv
	n := 0
	for rest = strings.TrimSpace(rest); rest != ""; {
		if rest[0] != ';' {
			return "", false
		}
		rest = strings.TrimSpace(rest[1:])
		i := strings.IndexByte(rest, ';')
		if i < 0 {
			i = len(rest)
		}
		p := rest[:i]
		rest = rest[i:]
		key, value, hasValue := strings.Cut(p, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !sfKey(key) || hasValue && value == "" || n == len(params) {
			return "", false
		}
		if !hasValue {
			value = "?1" // a parameter without a value is true
		}
		params[n] = kv{key, value}
		n++
	}
	// Only a member that reads whole is handed over.
	for _, p := range params[:n] {
		param(p.k, p.v)
	}
	return name, true
}

// sfString reads a quoted string at the start of s, returning its value and
// what follows.
func sfString(s string) (value, rest string, ok bool) {
	if i := strings.IndexAny(s[1:], `"\\`); i >= 0 && s[1+i] == '"' {
		if v := s[1 : 1+i]; sfPrintable(v) {
			return v, s[2+i:], true // no escapes: the common case
		}
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if i+1 >= len(s) || s[i+1] != '"' && s[i+1] != '\\' {
				return "", "", false
			}
			i++
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], true
		case c < 0x20 || c > 0x7e:
			return "", "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

func sfPrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// sfToken reports whether s is a structured-field token.
func sfToken(s string) bool {
	if s == "" || !(isAlpha(s[0]) || s[0] == '*') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(isAlpha(c) || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			return false
		}
	}
	return true
}

// sfKey reports whether s is a structured-field parameter key.
func sfKey(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '*') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			return false
		}
	}
	return true
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// sfInt is a parameter read as a non-negative structured-field integer (at
// most 15 digits).
type sfInt struct {
	n  int64
	ok bool
}

func (x *sfInt) set(v string) {
	*x = sfInt{}
	if v == "" || len(v) > 15 {
		return
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	*x = sfInt{n: n, ok: err == nil}
}
