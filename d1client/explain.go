package d1client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Explain is the failure for an operator, on one line: what happened and
// what to do about it, without the SQL (Error lists it, parameters
// redacted, which says nothing an operator can act on). A call that may
// have committed a write says to look before repeating it.
func (e *Error) Explain() string {
	s := e.explainKind()
	if e.Attempts > 1 {
		s += fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	if e.MayHaveCommitted() {
		s += "; the change may have been committed: look before repeating it"
	}
	return s
}

// MayHaveCommitted reports whether the failed call may have changed the
// database: it may have reached D1 (Ambiguous), and one of its statements
// writes. Ambiguity only matters for a write.
func (e *Error) MayHaveCommitted() bool {
	if !e.Ambiguous {
		return false
	}
	for _, s := range e.Statements {
		f := strings.Fields(s)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "SELECT", "PRAGMA", "EXPLAIN":
		default:
			return true
		}
	}
	return false
}

func (e *Error) explainKind() string {
	status := ""
	if st := e.Status(); st != "" {
		status = " (" + st + ")"
	}
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	switch {
	case errors.Is(e, ErrAuth):
		return fmt.Sprintf("D1 refused the credentials%s: %s; check the API token (it needs D1 edit permission), the account ID and the database ID", status, msg)
	case errors.Is(e, ErrNoDatabase):
		return fmt.Sprintf("D1 has no such database%s: %s; check the database ID", status, msg)
	case errors.Is(e, ErrRateLimited):
		wait := ""
		if e.RetryAfter > 0 {
			wait = fmt.Sprintf("; try again in %s", e.RetryAfter.Round(time.Second))
		} else if !e.BlockedUntil.IsZero() {
			wait = fmt.Sprintf("; try again after %s", e.BlockedUntil.UTC().Format(time.RFC3339))
		}
		return fmt.Sprintf("Cloudflare's API rate limit is reached%s: every API call of the account, the application's included, is blocked for up to 5 minutes%s", status, wait)
	case errors.Is(e, ErrNonJSON):
		return fmt.Sprintf("D1 answered with a page that is not JSON%s, an error of Cloudflare's edge or gateway; it is usually transient: try again", status)
	case errors.Is(e, ErrBudget):
		return fmt.Sprintf("the request budget is spent: %s", msg)
	case errors.Is(e, ErrOverloaded):
		return fmt.Sprintf("D1 reports the database overloaded%s: %s; try again shortly", status, msg)
	case errors.Is(e, ErrTransport):
		return fmt.Sprintf("cannot reach D1: %s", msg)
	}
	return fmt.Sprintf("D1 %s%s: %s", e.kind, status, msg)
}
