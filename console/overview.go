package console

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

// overviewView is the overview page: its live part, which its script
// fetches again (/live) every RefreshMS.
type overviewView struct {
	RefreshMS   int64 // 0: no refresh
	RefreshText string
	Live        liveView
}

// liveView is the overview's live part.
type liveView struct {
	ReadAt   string
	Footer   string
	Cards    []card
	Others   string // rows with a status the ledger does not write
	Oldest   *keyView
	Budget   []string
	Ring     ringView
	Homes    []homeView // when there are several databases
	Unread   []string   // databases that could not be read
	Stuck    []keyView
	StuckErr string
	// StuckNote says what the stuck list holds, or that it is empty;
	// StuckMore pages through all of them when there are more.
	StuckNote, StuckMore string
}

// card is a figure of the overview.
type card struct {
	ID, Label, Value, Note string
	Warn                   bool // the figure calls for attention
}

// homeView is one database's stats.
type homeView struct {
	Name                                                   string
	Keys, Pending, Completed, Awaiting, Backlog, Size, Err string
}

// ringView is the ring as each database recorded it.
type ringView struct {
	Summary string
	Detail  string
	Warn    bool
	Homes   []homeRingView
}

type homeRingView struct{ Name, Recorded, Err string }

// overviewPage serves the overview.
func (s *server) overviewPage(w http.ResponseWriter, r *http.Request) {
	rd, shared, err := s.overviewNow(r.Context())
	if err != nil {
		s.failed(w, r, "reading the overview", err)
		return
	}
	v := overviewView{RefreshText: "off", Live: s.liveView(rd, shared)}
	if s.refresh > 0 {
		v.RefreshMS, v.RefreshText = s.refresh.Milliseconds(), "every "+human.Duration(s.refresh)
	}
	s.render(w, r, http.StatusOK, "overview", &page{Title: "Overview", Nav: "overview"}, v)
}

// livePart serves the overview's live part alone, for its script.
func (s *server) livePart(w http.ResponseWriter, r *http.Request) {
	rd, shared, err := s.overviewNow(r.Context())
	if err != nil {
		s.log.Warn("console: reading the overview failed", "err", err)
		http.Error(w, "reading the overview failed: "+textsafe.Escape(err.Error()), http.StatusBadGateway)
		return
	}
	var b strings.Builder
	if err := s.pages["overview"].ExecuteTemplate(&b, "live", s.liveView(rd, shared)); err != nil {
		s.log.Error("console: rendering the overview", "err", err)
		http.Error(w, "the console could not render the overview", http.StatusInternalServerError)
		return
	}
	writeHTML(w, http.StatusOK, []byte(b.String()))
}

// liveView prepares a reading for the page.
func (s *server) liveView(rd *reading, shared bool) liveView {
	st := rd.Overview.Total
	v := liveView{ReadAt: human.Time(cmp.Or(st.AsOf, rd.At)), Footer: s.callsText(rd.Calls), Cards: cards(rd.Overview), Ring: s.ringView(rd.Ring), Budget: s.budgets(time.Now())}
	if shared {
		v.Footer = s.sharedText(rd)
	}
	var others []string
	for _, status := range st.OtherStatuses() {
		others = append(others, fmt.Sprintf("%s (%s)", textsafe.Display(string(status)), human.Count(st.ByStatus[status])))
	}
	if len(others) > 0 {
		v.Others = "Rows with a status the ledger does not write: " + strings.Join(others, ", ") + "."
	}
	if st.Oldest != nil {
		k := s.keyView(st.Oldest)
		v.Oldest = &k
	}
	for _, h := range rd.Overview.Homes {
		if h.Err != nil {
			v.Unread = append(v.Unread, fmt.Sprintf("%s: %s", textsafe.Display(s.name(h.Home)), textsafe.Escape(h.Err.Error())))
		}
	}
	if len(rd.Overview.Homes) > 1 {
		v.Homes = s.homes(rd.Overview)
	}
	s.stuck(&v, rd)
	return v
}

// cards are the overview's figures.
func cards(ov idem.Overview) []card {
	st := ov.Total
	ttl, retention := human.Duration(st.TTL), human.Duration(st.Retention)
	sizeCard := card{ID: "size", Label: "Size", Value: human.Size(float64(st.SizeBytes)), Warn: st.SizeBytes >= idem.D1MaxBytes*8/10,
		Note: share(st.SizeBytes) + " of D1's 10 GB limit of a database"}
	if len(ov.Homes) > 1 {
		sizeCard.Warn, sizeCard.Note = false, fmt.Sprintf("in all, over %d databases of 10 GB each", len(ov.Homes))
		for _, h := range ov.Homes {
			sizeCard.Warn = sizeCard.Warn || h.Stats.SizeBytes >= idem.D1MaxBytes*8/10
		}
	}
	return []card{
		{ID: "count-keys", Label: "Keys", Value: human.Count(st.Keys), Note: "rows in all"},
		{ID: "count-pending", Label: "Pending", Value: human.Count(st.ByStatus[idem.StatusPending]), Note: "running, or left by an owner that stopped"},
		{ID: "count-completed", Label: "Completed", Value: human.Count(st.ByStatus[idem.StatusCompleted]), Note: "retries replay their response"},
		{ID: "count-awaiting", Label: "Awaiting retry", Value: human.Count(st.Stuck), Warn: st.Stuck > 0,
			Note: "pending past the " + ttl + " TTL: the next retry takes each over"},
		{ID: "count-backlog", Label: "Sweep backlog", Value: human.Count(st.SweepBacklog), Warn: st.SweepBacklog > 0,
			Note: "rows older than the " + retention + " retention"},
		sizeCard,
	}
}

// share is a size as a share of D1's limit: "12%", "0.4%", "under 0.1%".
func share(n int64) string {
	p := 100 * float64(n) / idem.D1MaxBytes
	switch {
	case p < 0.1:
		return "under 0.1%"
	case p < 10:
		return fmt.Sprintf("%.1f%%", p)
	}
	return fmt.Sprintf("%.0f%%", p)
}

// homes are each database's stats.
func (s *server) homes(ov idem.Overview) []homeView {
	out := make([]homeView, 0, len(ov.Homes))
	for _, h := range ov.Homes {
		v := homeView{Name: textsafe.Display(s.name(h.Home))}
		if h.Err != nil {
			v.Err = "unreadable: " + textsafe.Escape(h.Err.Error())
		} else {
			st := h.Stats
			v.Keys, v.Pending, v.Completed = human.Count(st.Keys), human.Count(st.ByStatus[idem.StatusPending]), human.Count(st.ByStatus[idem.StatusCompleted])
			v.Awaiting, v.Backlog, v.Size = human.Count(st.Stuck), human.Count(st.SweepBacklog), human.Size(float64(st.SizeBytes))
		}
		out = append(out, v)
	}
	return out
}

// stuck prepares the keys whose owner has gone quiet.
func (s *server) stuck(v *liveView, rd *reading) {
	quiet := human.Duration(s.admin.QuietAfter())
	switch {
	case rd.StuckErr != nil:
		v.StuckErr = textsafe.Escape(rd.StuckErr.Error())
		return
	case len(rd.Stuck.Keys) == 0:
		v.StuckNote = fmt.Sprintf("None: every pending key was updated within the last %s (a live owner renews its key every %s).",
			quiet, human.Duration(s.ledger.Heartbeat))
		return
	}
	for i := range rd.Stuck.Keys {
		v.Stuck = append(v.Stuck, s.keyView(&rd.Stuck.Keys[i]))
	}
	// Those a release may help first, as d1idem keys stuck lists them.
	quietFirst := func(k keyView) int {
		if k.StateClass == string(idem.KeyOwnerQuiet) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(v.Stuck, func(a, b keyView) int { return cmp.Compare(quietFirst(a), quietFirst(b)) })
	v.StuckNote = fmt.Sprintf("Pending keys with no update for more than %s: those inside the TTL (owner quiet) first, then those past it; oldest first.", quiet)
	if rd.Stuck.NextCursor != "" {
		v.StuckNote = fmt.Sprintf("The %d oldest pending keys with no update for more than %s: those inside the TTL (owner quiet) first.", len(rd.Stuck.Keys), quiet)
		v.StuckMore = "/keys?" + url.Values{"status": {string(idem.StatusPending)}, "older_than": {human.Arg(s.admin.QuietAfter())}}.Encode()
	}
}

// budgets describe the API budget of each account the databases' clients
// spend (one, unless the application gave them several).
func (s *server) budgets(now time.Time) []string {
	var seen []*budget.Account
	var out []string
	for _, db := range s.dbs {
		a := db.Client.Account()
		if a == nil || slices.Contains(seen, a) {
			continue
		}
		seen = append(seen, a)
		out = append(out, budgetText(a.State(), now))
	}
	return out
}

// ringView describes the ring; st is nil for a ledger on one database.
func (s *server) ringView(st *idem.RingStatus) ringView {
	if st == nil {
		return ringView{Summary: "One database: the ledger has no ring."}
	}
	v := ringView{}
	r := st.Ring
	switch {
	case r.Version == 0:
		v.Summary, v.Warn = "No ring is recorded in any database: record one with d1idem ring init.", true
	case r.Phase == idem.RingMoving:
		v.Summary = fmt.Sprintf("Version %d, moving: from %s to %s.", r.Version, s.names(r.Previous), s.names(r.Homes))
		v.Detail = "Moved principals' existing keys stay at their old home until the old route is dropped (d1idem ring advance)"
		if !st.DropAt.IsZero() {
			v.Detail += ", at " + human.Time(st.DropAt) + " at the earliest"
		}
		v.Detail += "."
	default:
		v.Summary = fmt.Sprintf("Version %d, stable: %s.", r.Version, s.names(r.Homes))
	}
	for _, h := range st.Homes {
		hv := homeRingView{Name: textsafe.Display(s.name(h.ID)), Recorded: "nothing"}
		switch {
		case h.Err != nil:
			hv.Err, v.Warn = textsafe.Escape(h.Err.Error()), true
		case h.Ring != nil:
			hv.Recorded = fmt.Sprintf("version %d, %s, %s", h.Ring.Version, h.Ring.Phase, human.Age(h.Now.Sub(h.RecordedAt)))
		}
		v.Homes = append(v.Homes, hv)
	}
	return v
}

// names names the databases with these IDs.
func (s *server) names(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = textsafe.Display(s.name(id))
	}
	return strings.Join(out, ", ")
}
