package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// previewBytes is how much of a stored body keys get shows.
const previewBytes = 200

// renderKey writes keys get for people: the row's fields, then what the
// next retry gets and what to do, with the command that releases the key
// where that is the remedy. home, on several databases, says which holds
// the key.
func renderKey(w io.Writer, k *idem.KeyRecord, e idem.Explanation, release, home string) error {
	var fields [][2]string
	if home != "" {
		fields = append(fields, [2]string{"database", home})
	}
	if err := printFields(w, append(fields, [][2]string{
		{"principal", display(k.Principal)},
		{"key", display(k.Key)},
		{"status", statusText(k, e)},
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
	for _, line := range []string{e.Next, e.Remedy} {
		if line != "" {
			fmt.Fprintln(w, wrap(escapeText(line)))
		}
	}
	if e.Release != nil {
		fmt.Fprintf(w, "  %s\n", release)
	}
	return nil
}

// statusText is the row's status and state, and why: "pending, owner
// quiet: no update for 25s ...".
func statusText(k *idem.KeyRecord, e idem.Explanation) string {
	switch e.State {
	case idem.KeyCompleted:
		return "completed: " + e.Reason
	case idem.KeyUnknown:
		return display(string(k.Status)) + " (" + e.Reason + ")"
	}
	return fmt.Sprintf("%s, %s: %s", k.Status, stateWords(e.State), e.Reason)
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

// renderKeyPage writes keys list for people: a table, then the next
// cursor if there are more rows.
func renderKeyPage(w io.Writer, page idem.KeyPage, continued bool) error {
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
		if k.State != idem.KeyCompleted && k.State != idem.KeyUnknown {
			status += " (" + stateWords(k.State) + ")"
		}
		table = append(table, []string{cell(k.Principal), cell(k.Key), status, strconv.FormatInt(k.Generation, 10),
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

// renderStuck writes keys stuck for people: the owner-quiet keys, then
// those awaiting retry, and what to do about each group.
func renderStuck(w io.Writer, st idem.StuckKeys, heartbeat time.Duration, release string) error {
	ttl, total := human.Duration(st.TTL), st.NOwnerQuiet+st.NAwaitingRetry
	if total == 0 {
		_, err := fmt.Fprintf(w, "No stuck keys: every pending key was updated within the last %s (a live owner renews every %s).\n",
			human.Duration(st.QuietAfter), human.Duration(heartbeat))
		return err
	}
	var table [][]string
	for _, k := range append(append([]idem.KeyRecord{}, st.OwnerQuiet...), st.AwaitingRetry...) {
		table = append(table, []string{cell(k.Principal), cell(k.Key), strconv.FormatInt(k.Generation, 10),
			stateWords(k.State), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt), human.Age(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "GEN", "STATE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if st.Partial {
		fmt.Fprintf(w, "There are more than %d pending keys without a recent update; the counts below are of the oldest %[1]d.\n", total)
	}
	if st.NAwaitingRetry > 0 {
		fmt.Fprintf(w, "%s past the %s TTL, awaiting retry%s: the next retry of the same request takes each over,\nat the next generation, and executes it. Nothing needs releasing: a release sets a key's last update\none TTL back, so a key just released is one of these.\n",
			plural(st.NAwaitingRetry, "key", "keys"), ttl, shownOf(st.NAwaitingRetry, len(st.AwaitingRetry)))
	}
	if st.NOwnerQuiet > 0 {
		fmt.Fprintf(w, "%s inside the %s TTL whose owner has missed its heartbeats%s: retries get 409 until the TTL\nhas passed. To let the client retry now, release the key (fenced by its generation; --force, since\nthe ledger cannot prove the owner dead):\n  %s\n",
			plural(st.NOwnerQuiet, "key", "keys"), ttl, shownOf(st.NOwnerQuiet, len(st.OwnerQuiet)), release)
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

// renderRelease writes what keys release did and what happens next: the
// old owner's generation is fenced out, the row is released at the next,
// and the client's retry takes it over at the one after, as keys get then
// says.
func renderRelease(w io.Writer, res idem.ReleaseResult, hint string) error {
	k := &res.Before
	who := keyName(k.Principal, k.Key)
	if k.Status == idem.StatusCompleted {
		fmt.Fprintf(w, "Released %s: its completed row (response %s, completed %s) moved from generation %d to %d:\nreleased, awaiting retry.\n",
			who, statusOrDash(k.ResponseStatus), human.Age(k.SinceUpdate()), k.Generation, res.Generation)
		fmt.Fprintf(w, "The stored response is forgotten: the client's next request with this key (the same request) executes again,\nat generation %d.\n", res.Generation+1)
	} else {
		fmt.Fprintf(w, "Released %s: generation %d moved to %d (no update for %s, created %s);\nthe key is released, awaiting retry.\n",
			who, k.Generation, res.Generation, human.Duration(k.SinceUpdate()), human.Age(k.Age()))
		fmt.Fprintf(w, "The client may retry now: its next request with this key (the same request) takes the key over\nat generation %d and executes.\n", res.Generation+1)
		fmt.Fprintf(w, "The old owner (generation %d), if it is still running, may still perform its mutation, but its\n", k.Generation)
		fmt.Fprintf(w, "completion will be fenced out and not stored: the row is no longer at generation %d.\n", k.Generation)
		fmt.Fprintln(w, "An owner using the idem package learns at its next heartbeat that it has lost its lease.")
	}
	_, err := fmt.Fprintf(w, "See the row: d1idem keys get %s --key %s%s\n", principalArg(k.Principal), shellQuote(k.Key), hint)
	return err
}

// home names the database that holds a principal's key on several
// databases; "" on one. While the ring is moving, a moved principal's key
// may be at its old home, which is read first, as Admin.Get reads it.
// label names the database; text says more, for people.
func (ks *keysScope) home(ctx context.Context, principal, key string) (label, text string, err error) {
	if ks.ledger == nil {
		return "", "", nil
	}
	r, err := ks.ledger.Ring(ctx)
	if err != nil {
		return "", "", err
	}
	now, old := r.Home(principal), r.PreviousHome(principal)
	if old == "" {
		return ks.set.label(now), ks.set.label(now), nil
	}
	cn := ks.set.byID(old)
	if cn == nil {
		return "", "", fmt.Errorf("%w: %q", idem.ErrUnknownHome, old)
	}
	l, err := idem.New(cn.db, ks.cfg)
	if err != nil {
		return "", "", err
	}
	switch _, err := l.Admin().Get(ctx, principal, key); {
	case err == nil:
		return ks.set.label(old), fmt.Sprintf("%s (the principal's home before version %d; its new keys go to %s)", ks.set.label(old), r.Version, ks.set.label(now)), nil
	case errors.Is(err, idem.ErrKeyNotFound):
		return ks.set.label(now), fmt.Sprintf("%s (the principal's home since version %d, moved from %s)", ks.set.label(now), r.Version, ks.set.label(old)), nil
	}
	return "", "", err
}
