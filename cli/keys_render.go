package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/human"
)

// previewBytes is how much of a stored body keys get shows.
const previewBytes = 200

// keyDetailJSON is keys get --json.
type keyDetailJSON struct {
	keySummaryJSON
	Fingerprint         string            `json:"fingerprint"`
	ResponseHeaders     map[string]string `json:"response_headers"`
	ResponseHeadersRaw  *string           `json:"response_headers_raw"`
	ResponseBodyBytes   *int              `json:"response_body_bytes"`
	ResponseBodyPreview *string           `json:"response_body_preview"`
	TTLMS               int64             `json:"ttl_ms"`
	// Database names the database that holds the key, on a ledger across
	// several databases.
	Database string `json:"database,omitempty"`
}

func keyDetailOf(k *idem.KeyRecord, ls lease) keyDetailJSON {
	headers, _ := k.StoredHeaders()
	out := keyDetailJSON{keySummaryJSON: summaryJSON(k, ls), Fingerprint: k.Fingerprint,
		ResponseHeaders: headers, ResponseHeadersRaw: k.ResponseHeaders, TTLMS: ls.ttl.Milliseconds()}
	if k.ResponseBody != nil {
		p, _ := preview(*k.ResponseBody, previewBytes)
		n := len(*k.ResponseBody)
		out.ResponseBodyPreview, out.ResponseBodyBytes = &p, &n
	}
	return out
}

// renderKey writes keys get for people: the row's fields, then what the
// next retry gets and, where it helps, the command that releases the key.
// home, on a ledger across several databases, says which holds the key.
func renderKey(w io.Writer, k *idem.KeyRecord, ls lease, release, home string) error {
	var fields [][2]string
	if home != "" {
		fields = append(fields, [2]string{"database", home})
	}
	if err := printFields(w, append(fields, [][2]string{
		{"principal", display(k.Principal)},
		{"key", display(k.Key)},
		{"status", statusText(k, ls)},
		{"generation", strconv.FormatInt(k.Generation, 10)},
		{"created", fmt.Sprintf("%s  (%s)", human.Age(k.Age()), human.Time(k.CreatedAt))},
		{"updated", fmt.Sprintf("%s  (%s)", human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt))},
		{"fingerprint", display(k.Fingerprint)},
		{"response status", statusOrDash(k.ResponseStatus)},
		{"replay headers", headersText(k)},
		{"response body", bodyText(k)},
	}...)); err != nil {
		return err
	}
	fmt.Fprintln(w)
	_, err := fmt.Fprint(w, nextRetry(k, ls, release))
	return err
}

// statusText describes the row's status for people.
func statusText(k *idem.KeyRecord, ls lease) string {
	switch stateOf(k, ls) {
	case stateAwaitingRetry:
		return fmt.Sprintf("pending, awaiting retry: past the %s TTL (released, or its owner stopped renewing it)", human.Duration(ls.ttl))
	case stateOwnerQuiet:
		return fmt.Sprintf("pending, owner quiet: no update for %s (a live owner renews every %s), inside the %s TTL",
			human.Duration(k.SinceUpdate()), human.Duration(ls.heartbeat), human.Duration(ls.ttl))
	case stateInFlight:
		return fmt.Sprintf("pending: in flight, last updated %s (within the %s TTL)", human.Age(k.SinceUpdate()), human.Duration(ls.ttl))
	case stateCompleted:
		return "completed: retries replay the stored response"
	}
	return display(string(k.Status)) + " (not a status the ledger writes)"
}

// nextRetry says what the client's next retry gets.
func nextRetry(k *idem.KeyRecord, ls lease, release string) string {
	switch stateOf(k, ls) {
	case stateAwaitingRetry:
		return fmt.Sprintf("The next retry of the same request takes the key over (generation %d) and executes it.\nNothing needs releasing.\n",
			k.Generation+1)
	case stateOwnerQuiet:
		return fmt.Sprintf("Its owner has missed its heartbeats and is presumed dead. Retries get 409 %s until\nthe TTL has passed (in %s); to let the client retry now, release the key:\n  %s\n",
			idemhttp.CodeKeyInProgress, human.Duration(ls.ttl-k.SinceUpdate()), release)
	case stateInFlight:
		return fmt.Sprintf("Its owner is presumably still running (a live owner renews the row every %s).\nRetries get 409 %s until it completes, or until %s without an update.\n",
			human.Duration(ls.heartbeat), idemhttp.CodeKeyInProgress, human.Duration(ls.ttl))
	case stateCompleted:
		return fmt.Sprintf("Retries with this key replay the stored response, without executing, until the sweep\ndeletes the row (%s after its last update with the default retention).\n",
			human.Duration(idem.DefaultRetention))
	}
	return ""
}

// headersText shows the stored replay headers, one per line.
func headersText(k *idem.KeyRecord) string {
	headers, err := k.StoredHeaders()
	switch {
	case err != nil:
		return fmt.Sprintf("%s (not a JSON object of strings: %v)", strconv.Quote(*k.ResponseHeaders), err)
	case k.ResponseHeaders != nil && len(headers) == 0:
		return "(none)"
	case len(headers) == 0:
		return "-"
	}
	names := make([]string, 0, len(headers))
	for n := range headers {
		names = append(names, n)
	}
	sort.Strings(names)
	lines := make([]string, 0, len(names))
	for _, n := range names {
		lines = append(lines, display(n)+": "+display(headers[n]))
	}
	return strings.Join(lines, "\n")
}

// bodyText shows the stored body's size and its first bytes, quoted.
func bodyText(k *idem.KeyRecord) string {
	if k.ResponseBody == nil {
		if k.Status == idem.StatusCompleted {
			return "NULL (no body stored: an oversized response is stored as status 500 with no body)"
		}
		return "-"
	}
	p, more := preview(*k.ResponseBody, previewBytes)
	s := fmt.Sprintf("%s, %s", plural(int64(len(*k.ResponseBody)), "byte", "bytes"), strconv.Quote(p))
	if more > 0 {
		s += fmt.Sprintf(" ... (%d more bytes)", more)
	}
	return s
}

// keyPageJSON is keys list --json.
type keyPageJSON struct {
	Keys       []keySummaryJSON `json:"keys"`
	NextCursor *string          `json:"next_cursor"`
}

func keyPageJSONOf(page idem.KeyPage, ls lease) keyPageJSON {
	out := keyPageJSON{Keys: summariesJSON(page.Keys, ls)}
	if page.NextCursor != "" {
		out.NextCursor = &page.NextCursor
	}
	return out
}

// renderKeyPage writes keys list for people: a table, then the next
// cursor if there are more rows.
func renderKeyPage(w io.Writer, page idem.KeyPage, ls lease, continued bool) error {
	if len(page.Keys) == 0 {
		if continued {
			_, err := fmt.Fprintln(w, "No more keys after the cursor.")
			return err
		}
		_, err := fmt.Fprintln(w, "No keys match.")
		return err
	}
	table := make([][]string, 0, len(page.Keys))
	for i := range page.Keys {
		k := &page.Keys[i]
		status := display(string(k.Status))
		if s := stateOf(k, ls); s != stateCompleted && s != stateUnknown {
			status += " (" + s.words() + ")"
		}
		table = append(table, []string{display(k.Principal), display(k.Key), status, strconv.FormatInt(k.Generation, 10),
			statusOrDash(k.ResponseStatus), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt), human.Age(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "STATUS", "GEN", "RESPONSE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	if page.NextCursor != "" {
		_, err := fmt.Fprintf(w, "next cursor: %s\n", page.NextCursor)
		return err
	}
	return nil
}

// quietJSON is keys stuck --json.
type quietJSON struct {
	TTLMS         int64            `json:"ttl_ms"`
	QuietAfterMS  int64            `json:"quiet_after_ms"`
	Total         int64            `json:"total"`
	OwnerQuiet    int64            `json:"owner_quiet"`
	AwaitingRetry int64            `json:"awaiting_retry"`
	Partial       bool             `json:"partial"` // more rows than were read: the counts are of the oldest
	Keys          []keySummaryJSON `json:"keys"`
}

func quietJSONOf(q quiet) quietJSON {
	return quietJSON{TTLMS: q.lease.ttl.Milliseconds(), QuietAfterMS: q.lease.quietAfter().Milliseconds(), Total: q.nAll,
		OwnerQuiet: q.nQuiet, AwaitingRetry: q.nAwaiting, Partial: q.partial,
		Keys: append(summariesJSON(q.quiet, q.lease), summariesJSON(q.awaiting, q.lease)...)}
}

// renderQuiet writes keys stuck for people: the owner-quiet keys, then
// those awaiting retry, and what to do about each group.
func renderQuiet(w io.Writer, q quiet, release string) error {
	ttl := human.Duration(q.lease.ttl)
	if q.nAll == 0 {
		_, err := fmt.Fprintf(w, "No stuck keys: every pending key was updated within the last %s (a live owner renews every %s).\n",
			human.Duration(q.lease.quietAfter()), human.Duration(q.lease.heartbeat))
		return err
	}
	var table [][]string
	for _, k := range append(append([]idem.KeyRecord{}, q.quiet...), q.awaiting...) {
		table = append(table, []string{display(k.Principal), display(k.Key), strconv.FormatInt(k.Generation, 10),
			stateOf(&k, q.lease).words(), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt), human.Age(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "GEN", "STATE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if q.partial {
		fmt.Fprintf(w, "There are more than %d pending keys without a recent update; the counts below are of the oldest %[1]d.\n", q.nAll)
	}
	if q.nAwaiting > 0 {
		fmt.Fprintf(w, "%s past the %s TTL, awaiting retry%s: the next retry of the same request takes each over,\nat the next generation, and executes it. Nothing needs releasing: a release sets a key's last update\none TTL back, so a key just released is one of these.\n",
			plural(q.nAwaiting, "key", "keys"), ttl, shownOf(q.nAwaiting, len(q.awaiting)))
	}
	if q.nQuiet > 0 {
		fmt.Fprintf(w, "%s inside the %s TTL whose owner has missed its heartbeats%s: retries get 409 until the TTL\nhas passed. To let the client retry now, release the key (fenced by its generation; --force, since\nthe ledger cannot prove the owner dead):\n  %s\n",
			plural(q.nQuiet, "key", "keys"), ttl, shownOf(q.nQuiet, len(q.quiet)), release)
	}
	return nil
}

// shownOf notes when fewer rows are shown than there are.
func shownOf(total int64, shown int) string {
	if total > int64(shown) {
		return fmt.Sprintf(" (the %d oldest shown; raise --limit for more)", shown)
	}
	return ""
}

// releaseJSON is keys release --json.
type releaseJSON struct {
	Released  bool   `json:"released"`
	Principal string `json:"principal"`
	Key       string `json:"key"`
	// FromGeneration is the generation released; ToGeneration the row's
	// generation now, released, awaiting retry.
	FromGeneration int64 `json:"from_generation"`
	ToGeneration   int64 `json:"to_generation"`
	// Action is "expired" (a pending row) or "reset" (a completed row, with
	// --force: its response is forgotten).
	Action     string `json:"action"`
	FromStatus string `json:"from_status"`
	// Status and State are the row's now: pending, awaiting_retry.
	Status        string `json:"status"`
	State         string `json:"state"`
	Forced        bool   `json:"forced"`
	SinceUpdateMS int64  `json:"since_update_ms"` // before the release
	AgeMS         int64  `json:"age_ms"`
}

func releaseJSONOf(res idem.ReleaseResult, forced bool) releaseJSON {
	k := &res.Before
	action := "expired"
	if k.Status == idem.StatusCompleted {
		action = "reset"
	}
	return releaseJSON{Released: true, Principal: k.Principal, Key: k.Key, FromGeneration: k.Generation, ToGeneration: res.Generation,
		Action: action, FromStatus: string(k.Status), Status: string(idem.StatusPending), State: string(stateAwaitingRetry),
		Forced: forced, SinceUpdateMS: k.SinceUpdate().Milliseconds(), AgeMS: k.Age().Milliseconds()}
}

// renderRelease writes what keys release did and what happens next.
func renderRelease(w io.Writer, res idem.ReleaseResult, hint string) error {
	k := &res.Before
	who := keyName(k.Principal, k.Key)
	if k.Status == idem.StatusCompleted {
		fmt.Fprintf(w, "Released %s: its completed row (response %s, completed %s) moved from generation %d to %d:\nreleased, awaiting retry.\n",
			who, statusOrDash(k.ResponseStatus), human.Age(k.SinceUpdate()), k.Generation, res.Generation)
		_, err := fmt.Fprintln(w, "The stored response is forgotten: the client's next request with this key (the same request) executes again.")
		return err
	}
	fmt.Fprintf(w, "Released %s: generation %d moved to %d (no update for %s, created %s);\nthe key is released, awaiting retry.\n",
		who, k.Generation, res.Generation, human.Duration(k.SinceUpdate()), human.Age(k.Age()))
	fmt.Fprintln(w, "The client may retry now: its next request with this key (the same request) takes the key over and executes.")
	fmt.Fprintf(w, "The old owner (generation %d), if it is still running, may still perform its mutation, but its\n", k.Generation)
	fmt.Fprintf(w, "completion will be fenced out and not stored: the row is no longer at generation %d.\n", k.Generation)
	fmt.Fprintln(w, "An owner using the idem package learns at its next heartbeat that it has lost its lease.")
	_, err := fmt.Fprintf(w, "See the row: d1idem keys get %s --key %s%s\n", principalArg(k.Principal), shellQuote(k.Key), hint)
	return err
}
