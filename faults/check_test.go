package faults

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// reqRec is one HTTP request of the randomized run, as its client saw it.
type reqRec struct {
	Client   int
	Key      pk
	Role     string // "op" (the client's own attempts), "dup" (a concurrent duplicate), "replay" (a later check)
	Attempt  int
	Instance string
	Start    time.Duration // since the run's start
	End      time.Duration
	Status   int
	Replayed bool
	Code     string
	CT, Loc  string
	Body     string
	Err      string
}

func (r reqRec) final() bool {
	if r.Err != "" || r.Status >= 500 || r.Status == 0 {
		return false
	}
	if r.Status == http.StatusConflict {
		return r.Code != idem.CodeKeyInProgress && r.Code != idem.CodeKeyRetry
	}
	return true
}

// replayable is what a replay must reproduce byte for byte.
func (r reqRec) replayable() string {
	return fmt.Sprintf("%d|content-type=%s|location=%s|%s", r.Status, r.CT, r.Loc, r.Body)
}

func (r reqRec) String() string {
	s := fmt.Sprintf("%8v..%-8v c%02d %-6s #%d @%s ", r.Start.Round(time.Millisecond), r.End.Round(time.Millisecond), r.Client, r.Role, r.Attempt, r.Instance)
	if r.Err != "" {
		return s + "transport error: " + r.Err
	}
	rp := ""
	if r.Replayed {
		rp = " replayed"
	}
	return s + fmt.Sprintf("%d%s %s", r.Status, rp, r.Body)
}

// execRec is one run of the handler.
type execRec struct {
	Key        pk
	Exec       string
	Instance   string
	Start, End time.Duration
	Plan       string
	Outcome    string // "201", "422", "panic", "lease_lost"
}

func (e execRec) String() string {
	return fmt.Sprintf("%8v..%-8v exec %s @%s plan=%s outcome=%s", e.Start.Round(time.Millisecond), e.End.Round(time.Millisecond), e.Exec, e.Instance, e.Plan, e.Outcome)
}

// observations is everything the invariants are checked on: what the
// clients saw, what the handlers did, and what D1 holds and audited.
type observations struct {
	Seed        int64
	Keys        []pk
	Abandoned   map[pk]bool // keys whose client gave up after one attempt on purpose
	Requests    []reqRec
	Execs       []execRec
	Rows        map[pk]ledgerRow
	Business    map[pk][]businessRow
	Completions []completion
	Events      []event
	Logs        []logRec
	Start       int64 // D1 time of the run's start, ms
	// Transactional is true when the handler's business write goes through
	// idem.Tx: a non-replayed 201 from an owner whose completion was not
	// stored then describes a write that never happened, and is a violation.
	Transactional bool
}

// violation is one broken invariant.
type violation struct {
	Key       pk
	Invariant string
	Detail    string
}

// The invariants' names.
const (
	invOneCompletion = "at most one stored completion per (principal, key, generation)"
	invReplay        = "every replay is byte-identical to the first response"
	invExactlyOnce   = "the business write happens exactly once per completed key, never for others"
	invRetention     = "no completed row inside retention is lost or changed"
	invAnswers       = "every answer is one the middleware documents"
	invSettles       = "every operation settles"
)

// checkResult is the verdict on one run.
type checkResult struct {
	Violations []violation
	// Superseded counts non-replayed answers sent by an owner whose
	// completion was not the stored one (the old owner of a takeover):
	// their body names an execution other than the stored response's. The
	// spec admits them for a plain completion ("we still answer THIS
	// caller"); under idem.Tx a superseded 201 is a violation, since the
	// write it describes was aborted with its batch (see
	// TestRegressionFencedOutTxOwnerAnswersUncommittedWrite).
	Superseded []reqRec
	// Stolen lists keys whose stored completion was made by an execution
	// that began before the reservation it completed existed: a superseded
	// owner whose generation came round again after a release (see
	// TestRegressionReleaseRestartsGenerationABA).
	Stolen  []pk
	Replays int // replays compared
}

// stolenMargin absorbs the difference between the handler's clock and D1's
// (the same wall clock here) when ordering an execution's start against the
// audited claim it ran under.
const stolenMargin = 50 // ms

// canonical is the stored response of a completed row, as a replay must
// present it.
func canonical(r ledgerRow) string {
	var h map[string]string
	_ = json.Unmarshal([]byte(r.headers()), &h)
	body := ""
	if r.RespBody != nil {
		body = *r.RespBody
	}
	return fmt.Sprintf("%d|content-type=%s|location=%s|%s", r.status(), h["content-type"], h["location"], body)
}

// check verifies the invariants on a run's observations.
func check(o *observations) checkResult {
	var res checkResult
	bad := func(k pk, inv, format string, args ...any) {
		res.Violations = append(res.Violations, violation{k, inv, fmt.Sprintf(format, args...)})
	}
	reqs := map[pk][]reqRec{}
	for _, r := range o.Requests {
		reqs[r.Key] = append(reqs[r.Key], r)
	}

	// At most one stored completion per (principal, key, generation), and
	// per key at all: a completed row never returns to pending, and nothing
	// is old enough to be swept.
	perGen := map[string]int{}
	perKey := map[pk]int{}
	for _, c := range o.Completions {
		perGen[fmt.Sprintf("%s/%s/%d", c.P, c.K, c.Generation)]++
		perKey[pk{c.P, c.K}]++
	}
	for g, n := range perGen {
		if n > 1 {
			parts := strings.SplitN(g, "/", 3)
			bad(pk{parts[0], parts[1]}, invOneCompletion, "%d completions stored at generation %s", n, parts[2])
		}
	}
	for k, n := range perKey {
		if n > 1 {
			bad(k, invOneCompletion, "the key was completed %d times", n)
		}
	}

	// No completed row lost or changed: every audited completion is still
	// the row, response intact; no completed row was updated or deleted.
	for _, c := range o.Completions {
		k := pk{c.P, c.K}
		r, ok := o.Rows[k]
		switch {
		case !ok:
			bad(k, invRetention, "completed at generation %d, and the row is gone", c.Generation)
		case r.Status != "completed" || r.Generation != c.Generation || !eqPtr(r.RespStatus, c.Status) ||
			!eqPtr(r.RespBody, c.Body) || !eqPtr(r.RespHeaders, c.Hdrs):
			bad(k, invRetention, "completed at generation %d with %s, the row now holds %s generation %d %s", c.Generation, deref(c.Body), r.Status, r.Generation, r.body())
		}
	}
	for _, e := range o.Events {
		switch e.Kind {
		case "completed_row_updated", "completed_row_deleted":
			bad(pk{e.P, e.K}, invRetention, "audit: %s", e)
		case "duplicate_business_write":
			bad(pk{e.P, e.K}, invExactlyOnce, "audit: %s", e)
		}
	}

	execStart := map[string]time.Duration{}
	for _, e := range o.Execs {
		execStart[e.Exec] = e.Start
	}
	for _, c := range o.Completions {
		start, ok := execStart[execOf(deref(c.Body))]
		if !ok {
			continue
		}
		var reservedAt int64 // the claim or takeover the completion ran under
		for _, e := range o.Events {
			if e.P == c.P && e.K == c.K && (e.Kind == "claim" || e.Kind == "takeover") && e.At <= c.At {
				reservedAt = e.At
			}
		}
		if reservedAt-o.Start > start.Milliseconds()+stolenMargin {
			res.Stolen = append(res.Stolen, pk{c.P, c.K})
		}
	}

	for _, k := range o.Keys {
		r, completed := o.Rows[k]
		completed = completed && r.Status == "completed"
		biz := o.Business[k]

		// Exactly-once business writes.
		switch {
		case completed && r.status() == http.StatusCreated:
			if len(biz) != 1 {
				bad(k, invExactlyOnce, "completed with 201 and %d business rows %v", len(biz), execsOf(biz))
			} else if want := execOf(r.body()); biz[0].Exec != want {
				bad(k, invExactlyOnce, "the stored response names %s, the business row was written by %s", want, biz[0].Exec)
			}
		case completed && r.status() == http.StatusUnprocessableEntity:
			if len(biz) != 0 {
				bad(k, invExactlyOnce, "completed with 422 and %d business rows %v", len(biz), execsOf(biz))
			}
		case completed:
			bad(k, invExactlyOnce, "completed with unexpected status %d: %s", r.status(), r.body())
		default:
			if len(biz) != 0 {
				bad(k, invExactlyOnce, "never completed (row %q) but %d business rows %v", r.Status, len(biz), execsOf(biz))
			}
		}

		// Replays: every replay equals the stored response and the first
		// response the clients saw; a first response from a superseded
		// owner is counted apart.
		rs := reqs[k]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].End < rs[j].End })
		var first *reqRec
		for i := range rs {
			if !rs[i].Replayed && rs[i].final() && (rs[i].Status == 201 || rs[i].Status == 422) {
				if first == nil {
					first = &rs[i]
				}
				if completed && execOf(rs[i].Body) != execOf(r.body()) {
					res.Superseded = append(res.Superseded, rs[i])
					if o.Transactional && rs[i].Status == http.StatusCreated {
						// Its write was aborted with its fenced-out batch: the
						// answer describes a mutation that never happened.
						bad(k, invReplay, "a superseded owner answered %s, but its write was never committed; the stored response is %s", rs[i].replayable(), canonical(r))
					}
				}
			}
		}
		for _, q := range rs {
			if !q.Replayed {
				continue
			}
			res.Replays++
			if !completed {
				bad(k, invReplay, "replay %s of a key that is not completed", q)
				continue
			}
			if q.replayable() != canonical(r) {
				bad(k, invReplay, "replay %s differs from the stored response %s", q.replayable(), canonical(r))
			}
			if first != nil && q.Start >= first.End && q.replayable() != first.replayable() &&
				execOf(first.Body) == execOf(r.body()) {
				bad(k, invReplay, "replay %s differs from the first response %s", q.replayable(), first.replayable())
			}
		}

		// Answers: only what the middleware documents, for this workload.
		settled := false
		for _, q := range rs {
			if q.final() && q.Role != "dup" {
				settled = true
			}
			switch {
			case q.Err != "":
			case q.Status == 201 || q.Status == 422:
			case q.Status == 409 && (q.Code == idem.CodeKeyInProgress || q.Code == idem.CodeKeyRetry):
			case q.Status == 503 && (q.Code == idem.CodeLedgerUnavailable || q.Code == idem.CodeBudgetExhausted || q.Code == idem.CodeMutationAbandoned):
			default:
				bad(k, invAnswers, "unexpected answer %s", q)
			}
		}
		if !settled && !o.Abandoned[k] {
			bad(k, invSettles, "no final answer after %d requests", len(rs))
		}
	}
	return res
}

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}

func execsOf(rows []businessRow) []string {
	var out []string
	for _, b := range rows {
		out = append(out, b.Exec)
	}
	return out
}

// history renders everything known about one key, for a failure report.
func (o *observations) history(k pk) string {
	var b strings.Builder
	fmt.Fprintf(&b, "history of %s (seed %d; times since the run's start):\n", k, o.Seed)
	type line struct {
		at time.Duration
		s  string
	}
	var lines []line
	for _, r := range o.Requests {
		if r.Key == k {
			lines = append(lines, line{r.Start, "request " + r.String()})
		}
	}
	for _, e := range o.Execs {
		if e.Key == k {
			lines = append(lines, line{e.Start, e.String()})
		}
	}
	for _, e := range o.Events {
		if e.P == k.P && e.K == k.K {
			lines = append(lines, line{time.Duration(e.At-o.Start) * time.Millisecond, "D1 audit " + e.String()})
		}
	}
	for _, c := range o.Completions {
		if c.P == k.P && c.K == k.K {
			lines = append(lines, line{time.Duration(c.At-o.Start) * time.Millisecond,
				fmt.Sprintf("D1 audit completion stored gen=%d status=%d body=%s", c.Generation, derefInt(c.Status), deref(c.Body))})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s\n", l.s)
	}
	for _, l := range o.Logs {
		if l.Attrs["key"] == k.K {
			fmt.Fprintf(&b, "  log %s gen=%s: %s\n", l.Level, l.Attrs["generation"], l.Msg)
		}
	}
	if r, ok := o.Rows[k]; ok {
		fmt.Fprintf(&b, "  final row: %s generation %d status %d body %s headers %s\n", r.Status, r.Generation, r.status(), r.body(), r.headers())
	} else {
		fmt.Fprintf(&b, "  final row: none\n")
	}
	fmt.Fprintf(&b, "  business rows: %v\n", execsOf(o.Business[k]))
	return b.String()
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// The checker is not vacuous: each invariant fires on a history that
// breaks it, and stays quiet on one that keeps it.
func TestCheckerCatchesEachViolation(t *testing.T) {
	str := func(s string) *string { return &s }
	i64 := func(i int64) *int64 { return &i }
	k := pk{"acct", "k"}
	body := `{"exec":"k#1A","key":"k"}`
	hdrs := `{"content-type":"application/json","location":"/v1/things/k#1A"}`
	good := func() *observations {
		return &observations{
			Keys: []pk{k},
			Rows: map[pk]ledgerRow{k: {Principal: "acct", Key: "k", Status: "completed", Generation: 1,
				RespStatus: i64(201), RespBody: str(body), RespHeaders: str(hdrs)}},
			Business:    map[pk][]businessRow{k: {{P: "acct", K: "k", Exec: "k#1A"}}},
			Completions: []completion{{P: "acct", K: "k", Generation: 1, Status: i64(201), Body: str(body), Hdrs: str(hdrs)}},
			Requests: []reqRec{
				{Key: k, Role: "op", Start: 0, End: 10, Status: 201, CT: "application/json", Loc: "/v1/things/k#1A", Body: body},
				{Key: k, Role: "replay", Start: 20, End: 30, Status: 201, Replayed: true, CT: "application/json", Loc: "/v1/things/k#1A", Body: body},
			},
		}
	}
	if res := check(good()); len(res.Violations) != 0 || res.Replays != 1 {
		t.Fatalf("a clean history: %+v", res)
	}
	for _, tc := range []struct {
		name   string
		break_ func(o *observations)
		want   string
	}{
		{"two completions at one generation", func(o *observations) {
			o.Completions = append(o.Completions, o.Completions[0])
		}, invOneCompletion},
		{"replay differs", func(o *observations) {
			o.Requests[1].Body = `{"exec":"k#2B","key":"k"}`
		}, invReplay},
		{"replay header differs", func(o *observations) {
			o.Requests[1].Loc = "/v1/things/other"
		}, invReplay},
		{"double business write", func(o *observations) {
			o.Business[k] = append(o.Business[k], businessRow{P: "acct", K: "k", Exec: "k#2B"})
		}, invExactlyOnce},
		{"business write of another execution", func(o *observations) {
			o.Business[k] = []businessRow{{P: "acct", K: "k", Exec: "k#2B"}}
		}, invExactlyOnce},
		{"business write without completion", func(o *observations) {
			o.Rows[k] = ledgerRow{Principal: "acct", Key: "k", Status: "pending", Generation: 2}
			o.Completions = nil
			o.Requests = o.Requests[:1]
		}, invExactlyOnce},
		{"completed row lost", func(o *observations) {
			delete(o.Rows, k)
		}, invRetention},
		{"completed row changed", func(o *observations) {
			r := o.Rows[k]
			r.RespBody = str(`{"exec":"k#2B"}`)
			o.Rows[k] = r
		}, invRetention},
		{"audited deletion", func(o *observations) {
			o.Events = append(o.Events, event{Kind: "completed_row_deleted", P: "acct", K: "k"})
		}, invRetention},
		{"superseded owner's 201 under idem.Tx", func(o *observations) {
			o.Transactional = true
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "dup", Start: 5, End: 40, Status: 201,
				CT: "application/json", Loc: "/v1/things/k#2B", Body: `{"exec":"k#2B","key":"k"}`})
		}, invReplay},
		{"undocumented answer", func(o *observations) {
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "op", Status: 500, Code: idem.CodeRecordUnreadable})
		}, invAnswers},
		{"never settled", func(o *observations) {
			o.Requests = []reqRec{{Key: k, Role: "op", Status: 503, Code: idem.CodeLedgerUnavailable}}
		}, invSettles},
	} {
		o := good()
		tc.break_(o)
		res := check(o)
		found := false
		for _, v := range res.Violations {
			found = found || v.Invariant == tc.want
		}
		if !found {
			t.Errorf("%s: not caught (violations %+v)", tc.name, res.Violations)
		}
	}

	// A completion stored by an execution that began before the claim it
	// completed (the ABA of a release) is reported; one by the claim's own
	// execution is not.
	for _, tc := range []struct {
		execStart time.Duration
		stolen    bool
	}{{0, true}, {950 * time.Millisecond, false}} {
		o := good()
		o.Execs = []execRec{{Key: k, Exec: "k#1A", Start: tc.execStart}}
		gen2 := int64(2)
		o.Events = []event{
			{Kind: "claim", P: "acct", K: "k", At: 0},
			{Kind: "takeover", P: "acct", K: "k", Generation: &gen2, At: 500},
			{Kind: "released", P: "acct", K: "k", Generation: &gen2, At: 600},
			{Kind: "claim", P: "acct", K: "k", At: 900},
		}
		o.Completions[0].At = 1000
		if res := check(o); (len(res.Stolen) == 1) != tc.stolen {
			t.Errorf("execution started at %v: stolen %v, want %v", tc.execStart, res.Stolen, tc.stolen)
		}
	}
}
