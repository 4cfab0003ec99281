package d1client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

// encodeBody builds the request body: the single form for one statement,
// {"batch":[...]} for several.
func encodeBody(wire []wireStatement) []byte {
	if len(wire) == 1 {
		return wire[0]
	}
	n := len(`{"batch":[]}`) + len(wire)
	for _, w := range wire {
		n += len(w)
	}
	dst := append(make([]byte, 0, n), `{"batch":[`...)
	for _, w := range wire {
		dst = append(append(dst, w...), ',')
	}
	return append(dst[:len(dst)-1], "]}"...) // the last comma replaced
}

// send makes one HTTP attempt, its call taken from the budget: it POSTs body
// to /raw, gives the headers to the Account, and classifies the answer.
func (c *Client) send(ctx context.Context, body []byte, n int, coalesced bool) (results []Result, e *Error) {
	start := time.Now()
	defer func() {
		var k kind
		if e != nil {
			c.redact(e)
			k = e.kind
		}
		c.tel.call(coalesced, n, k, time.Since(start))
	}()
	actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(actx, http.MethodPost, c.rawURL, bytes.NewReader(body)) // New checked rawURL
	req.Header = http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/json"},
		"User-Agent":   {"d1idem-d1client (+https://github.com/d1idem/d1idem)"},
	}
	if *c.auth != "" {
		req.Header["Authorization"] = []string{*c.auth}
	}
	c.stats.calls.Add(1)
	c.stats.statements.Add(int64(n))
	res, err := c.http.Do(req)
	if err != nil {
		c.account.Answered(nil)
		return nil, transportError(err)
	}
	c.account.Answered(res.Header)
	raw, err := readBody(res)
	if err != nil {
		return nil, transportError(err)
	}
	if len(raw) > maxResponseBytes {
		return nil, &Error{kind: kindEnvelope, StatusCode: res.StatusCode, Ambiguous: true,
			Message: fmt.Sprintf("response body exceeds %d bytes", maxResponseBytes)}
	}
	return c.classify(res.StatusCode, res.Header, raw, n)
}

// readBody reads and closes the response body, at most maxResponseBytes+1
// bytes, in one buffer when the length is known.
func readBody(res *http.Response) ([]byte, error) {
	defer res.Body.Close()
	r := io.LimitReader(res.Body, maxResponseBytes+1)
	if n := res.ContentLength; n >= 0 && n <= maxResponseBytes {
		buf := make([]byte, n, n+1)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		// A body longer than announced is read on, as any other would be.
		var one [1]byte
		if k, _ := r.Read(one[:]); k == 0 {
			return buf, nil
		}
		rest, err := io.ReadAll(r)
		return append(append(buf, one[0]), rest...), err
	}
	return io.ReadAll(r)
}

// transportError wraps a failure without a response: ambiguous unless not even dialled.
func transportError(err error) *Error {
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	return &Error{kind: kindTransport, Ambiguous: !dial, Err: err, Message: err.Error()}
}

// redact removes the API token from every text of the error, should a
// server or proxy echo it back; the cause stays reachable by errors.Is.
func (c *Client) redact(e *Error) {
	tok := *c.token
	if tok == "" {
		return
	}
	e.Message = redactText(e.Message, tok)
	for i := range e.Details {
		e.Details[i].Message = redactText(e.Details[i].Message, tok)
	}
	if e.Err != nil {
		if s := e.Err.Error(); redactText(s, tok) != s { // kept for errors.Is alone
			e.Err = &redactedCause{text: redactText(s, tok), cause: e.Err}
		}
	}
}

// envelope is Cloudflare's v4 response envelope; its result decodes in the same pass.
type envelope struct {
	Success optBool       `json:"success"`
	Errors  []ErrorDetail `json:"errors"`
	Result  resultList    `json:"result"`
}

// authCodes mean the token or the account is wrong: authentication (10000,
// 10001), auth headers or token (9106, 9107, 9109, 6003, 6111, 6103), an
// account not authorized (7403), a bad account or database identifier (7003).
var authCodes = []int{10000, 10001, 9106, 9107, 9109, 6003, 6111, 6103, 7403, 7003}

// classify turns an answer into its n statements' results, or an *Error.
func (c *Client) classify(status int, header http.Header, body []byte, n int) ([]Result, *Error) {
	var env envelope
	if !fastEnvelope(body, n, &env) {
		if err := json.Unmarshal(body, &env); err != nil || env.Success == unset && !env.Result.present && env.Errors == nil {
			return nil, &Error{kind: kindNonJSON, StatusCode: status, Ambiguous: true,
				Message: bodySnippet(header, body), Err: err}
		}
	}
	e := &Error{StatusCode: status, Details: env.Errors}
	for _, d := range env.Errors {
		e.Codes = append(e.Codes, d.Code)
	}
	if len(env.Errors) > 0 {
		e.Message = env.Errors[0].Message
	}
	e.RetryAfter, _ = parseRetryAfter(header.Get("Retry-After"), time.Now())
	switch {
	case status >= 400:
		c.classifyFailure(e)
		return nil, e
	case env.Success != isTrue:
		e.kind, e.Ambiguous = kindEnvelope, true
		if e.Message == "" {
			e.Message = fmt.Sprintf("HTTP %d with success:false", status)
		}
		return nil, e
	}
	return env.Result.results(status, n)
}

// classifyFailure sets the kind of e, of status 400 or more; 971 blocks the account.
func (c *Client) classifyFailure(e *Error) {
	status := e.StatusCode
	switch {
	case status == http.StatusTooManyRequests && e.globalLimit():
		e.kind = kindRateLimited
		if e.RetryAfter <= 0 {
			e.RetryAfter = RateLimitBlock
		}
		e.BlockedUntil = time.Now().Add(e.RetryAfter)
		c.account.Block(e.BlockedUntil)
		c.log.Error("d1client: Cloudflare API rate limit reached (code 971); calls are blocked", slog.Time("until", e.BlockedUntil))
	case status == http.StatusTooManyRequests:
		e.kind, e.Ambiguous = kindOverloaded, true
	case slices.Contains(e.Codes, 7404): // database not found
		e.kind = kindNoDatabase
	case slices.ContainsFunc(e.Codes, func(c int) bool { return slices.Contains(authCodes, c) }),
		status == http.StatusUnauthorized, status == http.StatusForbidden:
		e.kind = kindAuth
	case status >= 500:
		e.kind, e.Ambiguous = kindTransient, true
	case slices.Contains(e.Codes, 7500):
		e.kind = kindSQL
		e.Message = strings.TrimPrefix(e.Message, "D1_ERROR: ")
		e.SQLiteCode, e.ExtendedCode = parseSQLiteCode(e.Message)
		e.violation = isViolation(e.SQLiteCode, e.Message)
	default:
		e.kind = kindRejected
	}
}

// globalLimit reports whether a 429 is Cloudflare's global API limit (code
// 971, or a message that says so) rather than D1's overload.
func (e *Error) globalLimit() bool {
	return slices.Contains(e.Codes, 971) || strings.Contains(strings.ToLower(e.Message), "throttl") || strings.Contains(e.Message, "1200")
}

// results returns a successful answer's results, checked against n statements sent.
func (l *resultList) results(status, n int) ([]Result, *Error) {
	malformed := func(msg string, err error) *Error {
		return &Error{kind: kindEnvelope, StatusCode: status, Ambiguous: true, Message: msg, Err: err}
	}
	switch {
	case l.err != nil || !l.present:
		return nil, malformed("result is not an array of statement results", cmp.Or(l.err, errors.New("no result")))
	case len(l.items) != n:
		return nil, &Error{kind: kindResultCount, StatusCode: status, Ambiguous: true,
			Message: fmt.Sprintf("%d statements sent, %d results returned", n, len(l.items))}
	}
	results := make([]Result, n)
	for i := range l.items {
		r := &l.items[i]
		if r.Success == isFalse {
			return nil, malformed(fmt.Sprintf("statement %d reported success:false", i+1), nil)
		}
		if err := r.Results.err; err != nil {
			return nil, malformed(fmt.Sprintf("statement %d: %v", i+1, err), err)
		}
		results[i] = Result{Columns: r.Results.columns, Rows: r.Results.rows, Meta: r.Meta.meta()}
	}
	return results, nil
}

var titlePattern = regexp.MustCompile(`(?is)<title>\s*(.*?)\s*</title>`)

// bodySnippet summarises a non-JSON body: an HTML title, or its first bytes.
func bodySnippet(header http.Header, body []byte) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	if m := titlePattern.FindSubmatch(body); m != nil {
		s = strings.Join(strings.Fields(string(m[1])), " ")
	} else if len(s) > 120 {
		s = s[:120] + "…"
	}
	return fmt.Sprintf("non-JSON %s body: %q", cmp.Or(header.Get("Content-Type"), "(no content type)"), s)
}
