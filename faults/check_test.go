package faults

import (
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
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
		return r.Code != idemhttp.CodeKeyInProgress && r.Code != idemhttp.CodeKeyRetry
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
// clients saw, what the handlers, the operator and the side callers did,
// and what D1 holds and audited.
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
	Skew        int64 // how far Start may be off, ms
	// Transactional is true when the handler's business write goes through
	// idemhttp.Tx: a non-replayed 201 from an owner whose completion was not
	// stored then describes a write that never happened, and is a violation.
	Transactional bool
	// Window is how long after a generation is granted its owner may still
	// write (MaxLease + TTL + RetentionMargin), and Retention how long a
	// row is kept after its last update, in ms.
	Window, Retention int64

	Ops      []opRec         // the operator's actions
	Side     []sideRec       // the side callers' calls
	SideRows map[string]int  // side_writes rows per token
	Faulted  map[string]bool // side tokens carried by a faulted call
	MultiSQL map[string]bool // tokens of multi-statement SQL that reached D1
}

// violation is one broken invariant.
type violation struct {
	Key       pk
	Invariant string
	Detail    string
}

// The invariants' names.
const (
	invOneCompletion = "one stored completion per generation, and per key until the operator forgets it or the sweep deletes it"
	invNo2xx         = "no 2xx for a business write that did not commit"
	invReplay        = "every replay, and the owner's own answer, is byte-identical to the stored response"
	invExactlyOnce   = "one business write per stored 201, by its execution, and none otherwise"
	invGeneration    = "a generation is never reused while its owner may be alive"
	invRetention     = "no completed row is lost or changed, and no row is swept inside the retention"
	invInnocent      = "co-batched callers get their own results; multi-statement SQL never reaches D1; a write runs at most once"
	invAnswers       = "every answer is one the middleware documents"
	invSettles       = "every operation settles"
)

// checkResult is the verdict on one run.
type checkResult struct {
	Violations []violation
	// Superseded counts non-replayed answers whose execution's response is
	// not a stored one (an old owner of a takeover): the spec admits them
	// for a plain completion ("we still answer THIS caller"); a 201 among
	// them under idemhttp.Tx is a violation, since the write it describes was
	// aborted with its batch (see
	// TestRegressionFencedOutTxOwnerAnswersUncommittedWrite).
	Superseded []reqRec
	Replays    int // replays compared
}

// stolenMargin absorbs the rounding of D1's clock to milliseconds (and on
// the bridge, with Skew, the measured difference between the clocks) when
// ordering an execution's start against the audited claim it ran under;
// replayMargin does the same for a replay against the completion it
// replayed.
const (
	stolenMargin = 100 // ms
	replayMargin = 250 // ms
)

// canonical is a stored response, as a replay must present it.
func canonical(status *int64, hdrs, body *string) string {
	var h map[string]string
	_ = json.Unmarshal([]byte(deref(hdrs)), &h)
	return fmt.Sprintf("%d|content-type=%s|location=%s|%s", derefInt(status), h["content-type"], h["location"], derefOr(body, ""))
}

func (c completion) canonical() string { return canonical(c.Status, c.Hdrs, c.Body) }

// genKey names one generation of one key.
func genKey(k pk, gen int64) string { return fmt.Sprintf("%s/%s/%d", k.P, k.K, gen) }

// check verifies the invariants on a run's observations.
func check(o *observations) checkResult {
	c := newChecker(o)
	c.oneCompletion()
	c.retention()
	c.generations()
	c.exactlyOnce()
	c.answers()
	c.no2xx()
	c.replays()
	c.settles()
	c.innocent()
	return c.res
}

// checker holds a run's observations indexed for the invariants, and the
// verdict as the checks add to it.
type checker struct {
	o   *observations
	res checkResult

	reqs      map[pk][]reqRec          // per key, in the order the answers arrived
	execStart map[string]time.Duration // per execution
	hist      map[pk]keyHistory
	ends      map[string]int64             // the end of each completion's standing, D1 ms
	comps     map[pk][]completion          // per key, in D1's order
	byGen     map[string]completion        // per generation (genKey)
	stored    map[pk]map[string]completion // per key: execution -> its stored completion
	rowsOf    map[pk]map[string]int        // per key: execution -> its business rows
}

// keyHistory is one key's audited events in D1's order, with the
// completion standing when each happened: a completion stands from its
// "completed" event until the operator releases the row or the sweep
// deletes it.
type keyHistory struct {
	events []event
	before []*event // the completion standing just before events[i], or nil
	final  *event   // the completion standing at the end, or nil
}

func newChecker(o *observations) *checker {
	c := &checker{o: o, reqs: map[pk][]reqRec{}, execStart: map[string]time.Duration{}, hist: map[pk]keyHistory{},
		ends: map[string]int64{}, comps: map[pk][]completion{}, byGen: map[string]completion{},
		stored: map[pk]map[string]completion{}, rowsOf: map[pk]map[string]int{}}
	for _, r := range o.Requests {
		c.reqs[r.Key] = append(c.reqs[r.Key], r)
	}
	for _, rs := range c.reqs {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].End < rs[j].End })
	}
	for _, e := range o.Execs {
		c.execStart[e.Exec] = e.Start
	}
	evs := map[pk][]event{}
	for _, e := range o.Events {
		evs[pk{e.P, e.K}] = append(evs[pk{e.P, e.K}], e)
	}
	for k, es := range evs {
		c.hist[k] = c.walkStandings(k, es)
	}
	for _, cm := range o.Completions {
		k := pk{cm.P, cm.K}
		c.comps[k] = append(c.comps[k], cm)
		c.byGen[genKey(k, cm.Generation)] = cm
		if c.stored[k] == nil {
			c.stored[k] = map[string]completion{}
		}
		c.stored[k][execOf(deref(cm.Body))] = cm
	}
	c.countBusinessRows()
	return c
}

// walkStandings follows which completion stands through one key's
// history, and records in c.ends when each stops standing.
func (c *checker) walkStandings(k pk, es []event) keyHistory {
	h := keyHistory{events: es, before: make([]*event, len(es))}
	var standing *event
	for i, e := range es {
		h.before[i] = standing
		switch e.Kind {
		case "completed", "completed_row_released", "completed_row_deleted":
			if standing != nil {
				c.ends[genKey(k, standing.gen())] = e.At
			}
			standing = nil
			if e.Kind == "completed" {
				standing = &es[i]
			}
		}
	}
	h.final = standing
	return h
}

// countBusinessRows counts each execution's business rows, for every key
// that has some or was planned.
func (c *checker) countBusinessRows() {
	for k, rows := range c.o.Business {
		n := map[string]int{}
		for _, b := range rows {
			n[b.Exec]++
		}
		c.rowsOf[k] = n
	}
	for _, k := range c.o.Keys {
		if c.rowsOf[k] == nil {
			c.rowsOf[k] = map[string]int{}
		}
	}
}

func (c *checker) bad(k pk, inv, format string, args ...any) {
	c.res.Violations = append(c.res.Violations, violation{k, inv, fmt.Sprintf(format, args...)})
}

// answered yields, for each planned key, its requests that got an answer
// and were not the two-key probe, in the order the answers arrived.
func (c *checker) answered() iter.Seq2[pk, reqRec] {
	return func(yield func(pk, reqRec) bool) {
		for _, k := range c.o.Keys {
			for _, q := range c.reqs[k] {
				if q.Role == "twokeys" || q.Err != "" {
					continue
				}
				if !yield(k, q) {
					return
				}
			}
		}
	}
}

// ownAnswer is whether q is an execution's own answer: a 201, or the
// handler's 422, not replayed.
func ownAnswer(q reqRec) bool {
	return !q.Replayed && (q.Status == http.StatusCreated || q.Status == http.StatusUnprocessableEntity && q.Code == "invalid_order")
}

// oneCompletion: one stored completion per generation, and per key no
// second completion while one stands (until the operator forgets it or
// the sweep deletes it past the retention).
func (c *checker) oneCompletion() {
	perGen := map[string]int{}
	for _, cm := range c.o.Completions {
		g := genKey(pk{cm.P, cm.K}, cm.Generation)
		if perGen[g]++; perGen[g] == 2 {
			c.bad(pk{cm.P, cm.K}, invOneCompletion, "two completions stored at generation %d", cm.Generation)
		}
	}
	for k, h := range c.hist {
		for i, e := range h.events {
			if e.Kind == "completed" && h.before[i] != nil {
				c.bad(k, invOneCompletion, "completed at generation %d while generation %d's completion stands (no forget, no sweep in between)", e.gen(), h.before[i].gen())
			}
		}
	}
}

// retention: a completed row changes only by the operator's release, no
// row is deleted inside the retention, and the completion standing at the
// end is the row.
func (c *checker) retention() {
	forgets := c.forgets()
	for k, h := range c.hist {
		for _, e := range h.events {
			switch e.Kind {
			case "completed_row_released":
				if !forgets[genKey(k, e.gen())] {
					c.bad(k, invRetention, "a completed row was released, and not by the operator: %s", e)
				}
			case "completed_row_deleted", "pending_row_deleted":
				if e.Extra != nil && e.At-*e.Extra < c.o.Retention {
					c.bad(k, invRetention, "swept %d ms after its last update, inside the retention (%d ms): %s", e.At-*e.Extra, c.o.Retention, e)
				}
			case "completed_row_updated":
				c.bad(k, invRetention, "audit: %s", e)
			}
		}
		if h.final != nil {
			c.standingIsRow(k, h.final)
		}
	}
}

// forgets is the operator's releases of completed rows (the only
// legitimate change of one): the generation each moved the row to. A
// release whose call failed may have landed.
func (c *checker) forgets() map[string]bool {
	forgets := map[string]bool{}
	for _, op := range c.o.Ops {
		if op.Kind != "sweep" && op.Key.K != "" && (op.Released && op.Before == idem.StatusCompleted || op.Err != "") {
			forgets[genKey(op.Key, op.Gen+1)] = true
		}
	}
	return forgets
}

// standingIsRow checks that the completion standing at the end of k's
// history is what its row holds.
func (c *checker) standingIsRow(k pk, standing *event) {
	cm, ok := c.byGen[genKey(k, standing.gen())]
	r, exists := c.o.Rows[k]
	switch {
	case !ok:
	case !exists:
		c.bad(k, invRetention, "completed at generation %d, and the row is gone", cm.Generation)
	case r.Status != "completed" || r.Generation != cm.Generation || !eqPtr(r.RespStatus, cm.Status) ||
		!eqPtr(r.RespBody, cm.Body) || !eqPtr(r.RespHeaders, cm.Hdrs):
		c.bad(k, invRetention, "completed at generation %d with %s, the row now holds %s generation %d %s", cm.Generation, deref(cm.Body), r.Status, r.Generation, r.body())
	}
}

// generations: a generation is granted (claim, takeover) at most once
// while an owner of it may be alive, and a completion is stored by the
// execution its generation was granted to, never by one that began before
// that grant (a superseded owner whose generation came round again).
func (c *checker) generations() {
	for k, h := range c.hist {
		grants := map[int64][]int64{}
		for _, e := range h.events {
			switch e.Kind {
			case "claim", "takeover":
				for _, at := range grants[e.gen()] {
					if e.At-at < c.o.Window {
						c.bad(k, invGeneration, "generation %d granted again (%s) %d ms after it was first granted, within the %d ms its owner may still write", e.gen(), e.Kind, e.At-at, c.o.Window)
						break
					}
				}
				grants[e.gen()] = append(grants[e.gen()], e.At)
			case "released":
				grants[e.gen()] = append(grants[e.gen()], e.At)
			}
		}
	}
	for _, cm := range c.o.Completions {
		c.storedByGrantee(cm)
	}
}

// storedByGrantee checks that the execution that stored cm did not start
// before cm's generation was granted.
func (c *checker) storedByGrantee(cm completion) {
	k := pk{cm.P, cm.K}
	exec := execOf(deref(cm.Body))
	start, ok := c.execStart[exec]
	if !ok {
		return
	}
	var granted int64 = -1
	for _, e := range c.hist[k].events {
		if (e.Kind == "claim" || e.Kind == "takeover") && e.gen() == cm.Generation && e.At <= cm.At {
			granted = e.At
		}
	}
	if granted >= 0 && granted-c.o.Start > start.Milliseconds()+stolenMargin+c.o.Skew {
		c.bad(k, invGeneration, "the completion at generation %d was stored by %s, which started %d ms before that generation was granted", cm.Generation, exec, granted-c.o.Start-start.Milliseconds())
	}
}

// exactlyOnce: business writes are one per stored 201, by its execution;
// none for a stored 422 or by an execution whose 201 is not stored.
func (c *checker) exactlyOnce() {
	for k, n := range c.rowsOf {
		for exec, cm := range c.stored[k] {
			switch derefInt(cm.Status) {
			case http.StatusCreated:
				if n[exec] != 1 {
					c.bad(k, invExactlyOnce, "the stored 201 of %s has %d business rows %v", exec, n[exec], execsOf(c.o.Business[k]))
				}
			case http.StatusUnprocessableEntity:
				if n[exec] != 0 {
					c.bad(k, invExactlyOnce, "the stored 422 of %s has %d business rows", exec, n[exec])
				}
			default:
				c.bad(k, invExactlyOnce, "completed with unexpected status %d: %s", derefInt(cm.Status), deref(cm.Body))
			}
		}
		for exec, m := range n {
			if cm, ok := c.stored[k][exec]; !ok || derefInt(cm.Status) != http.StatusCreated {
				c.bad(k, invExactlyOnce, "%s wrote %d business rows, but no 201 of it is stored (completions %d)", exec, m, len(c.comps[k]))
			}
		}
	}
}

// answers: every answer is one the middleware documents for this
// workload (a request with two Idempotency-Key fields is refused), and
// every execution ran under a key a client sent.
func (c *checker) answers() {
	planned := map[pk]bool{}
	for _, k := range c.o.Keys {
		planned[k] = true
	}
	for _, e := range c.o.Execs {
		if !planned[e.Key] {
			c.bad(e.Key, invAnswers, "execution %s ran under key %q, which no client sent (two Idempotency-Key fields merged?)", e.Exec, e.Key.K)
		}
	}
	for _, k := range c.o.Keys {
		for _, q := range c.reqs[k] {
			switch {
			case q.Role == "twokeys":
				if q.Err == "" && (q.Status != http.StatusBadRequest || q.Code != idemhttp.CodeKeyInvalid) {
					c.bad(k, invAnswers, "a request with two Idempotency-Key fields got %s", q)
				}
			case !documented(q):
				c.bad(k, invAnswers, "unexpected answer %s", q)
			}
		}
	}
}

// documented is whether q's answer is one the middleware documents for
// this workload (a transport error is no answer at all).
func documented(q reqRec) bool {
	switch {
	case q.Err != "":
		return true
	case q.Status == 201 || q.Status == 422:
		return true
	case q.Status == 409 && (q.Code == idemhttp.CodeKeyInProgress || q.Code == idemhttp.CodeKeyRetry):
		return true
	case q.Status == 503 && (q.Code == idemhttp.CodeLedgerUnavailable || q.Code == idemhttp.CodeBudgetExhausted || q.Code == idemhttp.CodeLedgerBusy || q.Code == idemhttp.CodeMutationAbandoned):
		return true
	}
	return false
}

// no2xx: an execution's 201 describes a business write that committed.
// It also collects the superseded answers: an execution's own answers
// whose response is not a stored one.
func (c *checker) no2xx() {
	for k, q := range c.answered() {
		if !ownAnswer(q) {
			continue
		}
		exec := execOf(q.Body)
		_, ok := c.stored[k][exec]
		if !ok {
			c.res.Superseded = append(c.res.Superseded, q)
		}
		if q.Status != http.StatusCreated {
			continue
		}
		switch {
		case c.o.Transactional && !ok:
			c.bad(k, invNo2xx, "%s answered %s, but no completion of it is stored: its write was never committed", exec, q.replayable())
		case c.rowsOf[k][exec] == 0:
			c.bad(k, invNo2xx, "%s answered %s, and wrote no business row", exec, q.replayable())
		}
	}
}

// replays: every replay is the completion that stood while it was made,
// and an execution's own answer is its stored response, byte for byte.
func (c *checker) replays() {
	for k, q := range c.answered() {
		switch {
		case q.Replayed:
			c.res.Replays++
			c.replay(k, q)
		case ownAnswer(q):
			if cm, ok := c.stored[k][execOf(q.Body)]; ok && q.replayable() != cm.canonical() {
				c.bad(k, invReplay, "the owner's own answer %s differs from its stored response %s", q.replayable(), cm.canonical())
			}
		}
	}
}

// replay checks one replay against the completions that may have stood
// while it was made.
func (c *checker) replay(k pk, q reqRec) {
	cs := c.comps[k]
	if len(cs) == 0 {
		c.bad(k, invReplay, "replay %s of a key that never completed", q)
		return
	}
	matched, last := false, ""
	for _, cm := range cs {
		endAt, ended := c.ends[genKey(k, cm.Generation)]
		margin := replayMargin + c.o.Skew
		if len(cs) > 1 && (cm.At-c.o.Start > q.End.Milliseconds()+margin || ended && endAt-c.o.Start < q.Start.Milliseconds()-margin) {
			continue
		}
		last = cm.canonical()
		matched = matched || q.replayable() == last
	}
	if !matched {
		c.bad(k, invReplay, "replay %s differs from the stored response %s", q.replayable(), last)
	}
}

// settles: every operation a client did not abandon gets a final answer
// (a concurrent duplicate's or the two-key probe's does not count).
func (c *checker) settles() {
	for _, k := range c.o.Keys {
		rs := c.reqs[k]
		settled := false
		for _, q := range rs {
			if q.final() && q.Role != "dup" && q.Role != "twokeys" {
				settled = true
			}
		}
		if !settled && !c.o.Abandoned[k] {
			c.bad(k, invSettles, "no final answer after %d requests", len(rs))
		}
	}
}

// innocent: the side callers each get their own result, or an error only
// when their own call was faulted, never sent (a 971 block, the budget, a
// group commit queue too long to wait for on a loaded machine) or
// not answered by its own deadline (a loaded machine); multi-statement SQL
// is refused before it is sent; a write runs once (none when its error
// says nothing was committed).
func (c *checker) innocent() {
	for _, sc := range c.o.Side {
		k := pk{"side", sc.Token}
		excused := sc.ErrKind == "rate_limited" || sc.ErrKind == "budget" || sc.ErrKind == "shed" || sc.Timeout || c.o.Faulted[sc.Token]
		if c.o.MultiSQL[sc.Token] {
			c.bad(k, invInnocent, "multi-statement SQL reached D1: %s", sc.SQL)
		}
		switch sc.Kind {
		case "multi":
			if sc.ErrKind != "invalid" {
				c.bad(k, invInnocent, "multi-statement SQL was not refused before sending: %q", sc.Err)
			}
		case "echo":
			switch {
			case sc.Err == "" && sc.Result != sc.Token:
				c.bad(k, invInnocent, "an echo of %q returned %q", sc.Token, sc.Result)
			case sc.Err != "" && !excused:
				c.bad(k, invInnocent, "an echo got an error although its call was never faulted: %s", sc.Err)
			}
		case "write":
			c.sideWrite(k, sc, excused)
		}
	}
}

// sideWrite checks one side caller's write against the rows it left.
func (c *checker) sideWrite(k pk, sc sideRec, excused bool) {
	n := c.o.SideRows[sc.Token]
	switch {
	case n > 1:
		c.bad(k, invInnocent, "the write %q ran %d times (error: %q)", sc.SQL, n, sc.Err)
	case sc.Err == "" && n != 1:
		c.bad(k, invInnocent, "the write %q succeeded with %d rows", sc.SQL, n)
	case sc.Err != "" && !sc.Ambiguous && n != 0:
		c.bad(k, invInnocent, "the write's error says nothing was committed, yet it left %d row: %s", n, sc.Err)
	}
	if sc.Err != "" && !excused {
		c.bad(k, invInnocent, "a write got an error although its call was never faulted (committed: %d rows): %s", n, sc.Err)
	}
}

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func deref(s *string) string { return derefOr(s, "<null>") }

func derefOr(s *string, or string) string {
	if s == nil {
		return or
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
				fmt.Sprintf("D1 audit completion stored gen=%d status=%d body=%s headers=%s", c.Generation, derefInt(c.Status), deref(c.Body), deref(c.Hdrs))})
		}
	}
	for _, op := range o.Ops {
		if op.Key == k {
			lines = append(lines, line{op.At, fmt.Sprintf("operator %s gen=%d released=%v before=%s err=%q", op.Kind, op.Gen, op.Released, op.Before, op.Err)})
		}
	}
	for _, sc := range o.Side {
		if k.P == "side" && sc.Token == k.K {
			lines = append(lines, line{sc.At, fmt.Sprintf("side %s on %s coalesced=%v: %q -> result %q err %q (ambiguous %v, call faulted %v, rows %d, reached D1 as multi-statement SQL %v)",
				sc.Kind, sc.Instance, sc.Coalesced, sc.SQL, sc.Result, sc.Err, sc.Ambiguous, o.Faulted[sc.Token], o.SideRows[sc.Token], o.MultiSQL[sc.Token])})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s\n", l.s)
	}
	for _, l := range o.Logs {
		if l.Attrs["key"] == k.K || len(k.K) > logKeyPrefix && l.Attrs["key"] == k.K[:logKeyPrefix]+"…" {
			fmt.Fprintf(&b, "  log %s gen=%s: %s\n", l.Level, l.Attrs["generation"], l.Msg)
		}
	}
	if k.P == "side" {
		return b.String()
	}
	if r, ok := o.Rows[k]; ok {
		fmt.Fprintf(&b, "  final row: %s generation %d status %d body %s headers %s\n", r.Status, r.Generation, r.status(), r.body(), r.headers())
	} else {
		fmt.Fprintf(&b, "  final row: none\n")
	}
	fmt.Fprintf(&b, "  business rows: %v\n", execsOf(o.Business[k]))
	return b.String()
}

// logKeyPrefix is how much of a key the ledger's logs show.
const logKeyPrefix = 16

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// The checker is not vacuous: each invariant fires on a history that
// breaks it, and stays quiet on the clean history and on the legitimate
// variations (an operator's forget, a sweep past the retention, a faulted
// side call).
func TestCheckerCatchesEachViolation(t *testing.T) {
	str := func(s string) *string { return &s }
	i64 := func(i int64) *int64 { return &i }
	k := pk{"acct", "k"}
	body := `{"exec":"k#1A","key":"k"}`
	body2 := `{"exec":"k#2B","key":"k"}`
	hdrs := `{"content-type":"application/json","location":"/v1/things/k#1A"}`
	hdrs2 := `{"content-type":"application/json","location":"/v1/things/k#2B"}`
	ev := func(kind string, gen, at int64) event {
		return event{Kind: kind, P: "acct", K: "k", Generation: i64(gen), At: at}
	}
	good := func() *observations {
		return &observations{
			Keys: []pk{k},
			Rows: map[pk]ledgerRow{k: {Principal: "acct", Key: "k", Status: "completed", Generation: 1,
				RespStatus: i64(201), RespBody: str(body), RespHeaders: str(hdrs)}},
			Business:    map[pk][]businessRow{k: {{P: "acct", K: "k", Exec: "k#1A"}}},
			Completions: []completion{{P: "acct", K: "k", Generation: 1, Status: i64(201), Body: str(body), Hdrs: str(hdrs), At: 5}},
			Events:      []event{ev("claim", 1, 1), ev("completed", 1, 5)},
			Execs:       []execRec{{Key: k, Exec: "k#1A", Start: 2 * time.Millisecond}},
			Requests: []reqRec{
				{Key: k, Role: "op", Start: 0, End: 10 * time.Millisecond, Status: 201, CT: "application/json", Loc: "/v1/things/k#1A", Body: body},
				{Key: k, Role: "replay", Start: 20 * time.Millisecond, End: 30 * time.Millisecond, Status: 201, Replayed: true, CT: "application/json", Loc: "/v1/things/k#1A", Body: body},
			},
			Transactional: true, Window: 60_000, Retention: 60_000,
			SideRows: map[string]int{"w1": 1}, Faulted: map[string]bool{}, MultiSQL: map[string]bool{},
			Side: []sideRec{
				{Kind: "echo", Token: "e1", Result: "e1"},
				{Kind: "multi", Token: "m1", Err: "refused", ErrKind: "invalid"},
				{Kind: "write", Token: "w1"},
			},
		}
	}
	// The operator forgets the completed row (generation 1 -> 2), and a
	// new execution completes generation 3.
	forgotten := func(o *observations) {
		o.Ops = []opRec{{Kind: "forget", Key: k, Gen: 1, Released: true, Before: idem.StatusCompleted}}
		o.Events = append(o.Events, ev("completed_row_released", 2, 40), ev("released", 2, 40), ev("takeover", 3, 50), ev("completed", 3, 60))
		o.Completions = append(o.Completions, completion{P: "acct", K: "k", Generation: 3, Status: i64(201), Body: str(body2), Hdrs: str(hdrs2), At: 60})
		o.Rows[k] = ledgerRow{Principal: "acct", Key: "k", Status: "completed", Generation: 3, RespStatus: i64(201), RespBody: str(body2), RespHeaders: str(hdrs2)}
		o.Business[k] = append(o.Business[k], businessRow{P: "acct", K: "k", Exec: "k#2B"})
		o.Execs = append(o.Execs, execRec{Key: k, Exec: "k#2B", Start: 45 * time.Millisecond})
		o.Requests = append(o.Requests, reqRec{Key: k, Role: "replay", Start: 45 * time.Millisecond, End: 70 * time.Millisecond, Status: 201,
			CT: "application/json", Loc: "/v1/things/k#2B", Body: body2})
	}
	for _, tc := range []struct {
		name   string
		modify func(o *observations)
	}{
		{"the clean history", func(*observations) {}},
		{"an operator's forget and a second execution", forgotten},
		{"a replay of the completion that stood before the forget", func(o *observations) {
			forgotten(o)
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "replay", Start: 25 * time.Millisecond, End: 35 * time.Millisecond, Status: 201, Replayed: true,
				CT: "application/json", Loc: "/v1/things/k#1A", Body: body})
		}},
		{"a sweep past the retention", func(o *observations) {
			o.Events = append(o.Events, event{Kind: "completed_row_deleted", P: "acct", K: "k", Generation: i64(1), Extra: i64(5), At: 70_000})
			delete(o.Rows, k)
		}},
		{"a side call faulted", func(o *observations) {
			o.Faulted["e1"], o.Faulted["w1"] = true, true
			o.Side[0].Err, o.Side[0].ErrKind, o.Side[0].Result = "d1: transient", "transient", ""
			o.Side[2].Err, o.Side[2].Ambiguous = "d1: transient; the request may have been committed", true
		}},
		{"a side call refused during a 971 block", func(o *observations) {
			o.Side[2].Err, o.Side[2].ErrKind = "d1: rate limited", "rate_limited"
			o.SideRows["w1"] = 0
		}},
	} {
		o := good()
		tc.modify(o)
		if res := check(o); len(res.Violations) != 0 || res.Replays == 0 {
			t.Errorf("%s: %+v", tc.name, res)
		}
	}

	for _, tc := range []struct {
		name   string
		break_ func(o *observations)
		want   string
	}{
		{"two completions at one generation", func(o *observations) {
			o.Completions = append(o.Completions, o.Completions[0])
		}, invOneCompletion},
		{"a second completion while the first stands", func(o *observations) {
			o.Events = append(o.Events, ev("takeover", 2, 7), ev("completed", 2, 8))
			o.Completions = append(o.Completions, completion{P: "acct", K: "k", Generation: 2, Status: i64(201), Body: str(body2), Hdrs: str(hdrs2), At: 8})
		}, invOneCompletion},
		{"replay differs", func(o *observations) {
			o.Requests[1].Body = body2
		}, invReplay},
		{"replay header differs", func(o *observations) {
			o.Requests[1].Loc = "/v1/things/other"
		}, invReplay},
		{"a replay of a completion already forgotten", func(o *observations) {
			forgotten(o)
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "replay", Start: 500 * time.Millisecond, End: 510 * time.Millisecond, Status: 201, Replayed: true,
				CT: "application/json", Loc: "/v1/things/k#1A", Body: body})
		}, invReplay},
		{"the owner's own answer differs from what is stored", func(o *observations) {
			o.Requests[0].Loc = "/v1/things/k#1A/caf\xe9"
		}, invReplay},
		{"a 201 whose write never committed", func(o *observations) {
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "dup", Start: 5, End: 40, Status: 201,
				CT: "application/json", Loc: "/v1/things/k#2B", Body: body2})
		}, invNo2xx},
		{"a 201 with no business row", func(o *observations) {
			o.Transactional = false
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "dup", Start: 5, End: 40, Status: 201,
				CT: "application/json", Loc: "/v1/things/k#2B", Body: body2})
		}, invNo2xx},
		{"double business write", func(o *observations) {
			o.Business[k] = append(o.Business[k], businessRow{P: "acct", K: "k", Exec: "k#2B"})
		}, invExactlyOnce},
		{"business write of another execution", func(o *observations) {
			o.Business[k] = []businessRow{{P: "acct", K: "k", Exec: "k#2B"}}
		}, invExactlyOnce},
		{"business write without completion", func(o *observations) {
			o.Rows[k] = ledgerRow{Principal: "acct", Key: "k", Status: "pending", Generation: 2}
			o.Completions, o.Events = nil, o.Events[:1]
			o.Requests = o.Requests[:0]
			o.Abandoned = map[pk]bool{k: true}
		}, invExactlyOnce},
		{"completed row lost", func(o *observations) {
			delete(o.Rows, k)
		}, invRetention},
		{"completed row changed", func(o *observations) {
			r := o.Rows[k]
			r.RespBody = str(body2)
			o.Rows[k] = r
		}, invRetention},
		{"completed row swept inside the retention", func(o *observations) {
			o.Events = append(o.Events, event{Kind: "completed_row_deleted", P: "acct", K: "k", Generation: i64(1), Extra: i64(5), At: 6_000})
			delete(o.Rows, k)
		}, invRetention},
		{"pending row swept inside the retention", func(o *observations) {
			o.Events = append(o.Events, event{Kind: "pending_row_deleted", P: "aged", K: "x", Generation: i64(1), Extra: i64(5), At: 6_000})
		}, invRetention},
		{"completed row released, not by the operator", func(o *observations) {
			forgotten(o)
			o.Ops = nil
		}, invRetention},
		{"audited change of a completed row", func(o *observations) {
			o.Events = append(o.Events, ev("completed_row_updated", 1, 9))
		}, invRetention},
		{"a generation granted again within the window", func(o *observations) {
			o.Events = append(o.Events, event{Kind: "pending_row_deleted", P: "acct", K: "k", Generation: i64(2), Extra: i64(-3_600_000), At: 20},
				ev("claim", 1, 30))
		}, invGeneration},
		{"a completion stored by an execution older than its grant", func(o *observations) {
			o.Events[0].At = 1_000
			o.Completions[0].At = 1_100
			o.Events[1].At = 1_100
		}, invGeneration},
		{"undocumented answer", func(o *observations) {
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "op", Status: 500, Code: idemhttp.CodeRecordUnreadable})
		}, invAnswers},
		{"two Idempotency-Key fields accepted", func(o *observations) {
			o.Requests = append(o.Requests, reqRec{Key: k, Role: "twokeys", Status: 201, Body: body})
		}, invAnswers},
		{"an execution under a key nobody sent", func(o *observations) {
			o.Execs = append(o.Execs, execRec{Key: pk{"acct", "k, k~2"}, Exec: "k, k~2#1A"})
		}, invAnswers},
		{"never settled", func(o *observations) {
			o.Requests = []reqRec{{Key: k, Role: "op", Status: 503, Code: idemhttp.CodeLedgerUnavailable}}
		}, invSettles},
		{"an echo answered with another caller's value", func(o *observations) {
			o.Side[0].Result = "e2"
		}, invInnocent},
		{"an echo failed with no fault on its call", func(o *observations) {
			o.Side[0].Err, o.Side[0].ErrKind = "d1: result count does not match", "result_count"
		}, invInnocent},
		{"multi-statement SQL not refused", func(o *observations) {
			o.Side[1].Err, o.Side[1].ErrKind = "d1: result count does not match", "result_count"
		}, invInnocent},
		{"multi-statement SQL reached D1", func(o *observations) {
			o.MultiSQL["m1"] = true
		}, invInnocent},
		{"a write ran twice", func(o *observations) {
			o.SideRows["w1"] = 2
		}, invInnocent},
		{"a write failed with no fault on its call", func(o *observations) {
			o.Side[2].Err, o.Side[2].ErrKind, o.Side[2].Ambiguous = "d1: result count does not match", "result_count", true
		}, invInnocent},
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
}
