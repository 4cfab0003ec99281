package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
)

// ringJSON is a ring under --json: the IDs of its databases.
type ringJSON struct {
	Version  int64    `json:"version"`
	Phase    string   `json:"phase"`
	Homes    []string `json:"homes"`
	Previous []string `json:"previous"`
}

func ringJSONOf(r *idem.Ring) *ringJSON {
	if r == nil || r.Version == 0 {
		return nil
	}
	prev := r.Previous
	if prev == nil {
		prev = []string{}
	}
	return &ringJSON{Version: r.Version, Phase: string(r.Phase), Homes: r.Homes, Previous: prev}
}

// ringStatusJSON is ring status --json.
type ringStatusJSON struct {
	// Ring is the newest ring recorded in any database; null when none.
	Ring *ringJSON `json:"ring"`
	// Adds are, while the ring is moving, the databases the change adds.
	Adds        []string       `json:"adds"`
	DropAt      *string        `json:"drop_at"`
	DropAtMS    *int64         `json:"drop_at_ms"`
	TTLMS       int64          `json:"ttl_ms"`
	RetentionMS int64          `json:"retention_ms"`
	Databases   []homeRingJSON `json:"databases"`
}

// homeRingJSON is what one database has recorded.
type homeRingJSON struct {
	Database     string    `json:"database"`
	ID           string    `json:"id"`
	Ring         *ringJSON `json:"ring"`
	RecordedAt   *string   `json:"recorded_at"`
	RecordedAtMS *int64    `json:"recorded_at_ms"`
	HasKeys      bool      `json:"has_keys"`
	// Identity is the home ID the database recorded when it joined; null if none.
	Identity *string `json:"identity"`
	// Lost says that the ring names the database but it holds no identity:
	// it was replaced or wiped.
	Lost  bool    `json:"lost"`
	Error *string `json:"error"`
}

// ringResultJSON is ring init, grow and advance --json: what was done, and
// the status after it.
type ringResultJSON struct {
	Action string `json:"action"`
	Done   string `json:"done"`
	ringStatusJSON
}

func (rc *ringCtx) statusJSON(st idem.RingStatus) ringStatusJSON {
	out := ringStatusJSON{Ring: ringJSONOf(&st.Ring), Adds: []string{}, TTLMS: rc.ttl.Milliseconds(), RetentionMS: rc.retention.Milliseconds(),
		Databases: make([]homeRingJSON, 0, len(st.Homes))}
	if st.Ring.Phase == idem.RingMoving {
		out.Adds = added(st.Ring)
	}
	if !st.DropAt.IsZero() {
		at, ms := human.Time(st.DropAt), st.DropAt.UnixMilli()
		out.DropAt, out.DropAtMS = &at, &ms
	}
	for _, h := range st.Homes {
		j := homeRingJSON{Database: rc.set.label(h.ID), ID: h.ID, Ring: ringJSONOf(h.Ring), HasKeys: h.HasKeys, Lost: isLost(st, h)}
		if h.Identity != "" {
			j.Identity = &h.Identity
		}
		if h.Err != nil {
			msg := describe(h.Err)
			j.Error = &msg
		}
		if h.Ring != nil {
			at, ms := human.Time(h.RecordedAt), h.RecordedAt.UnixMilli()
			j.RecordedAt, j.RecordedAtMS = &at, &ms
		}
		out.Databases = append(out.Databases, j)
	}
	for _, id := range notNamed(st) {
		msg := notNamedText
		out.Databases = append(out.Databases, homeRingJSON{Database: id, ID: id, Error: &msg})
	}
	return out
}

// notNamedText is the status of a database of the ring that the command
// was not given.
const notNamedText = "not given here: name it too"

// render writes a ring status for people: the newest ring, what moves and
// when the old route can be dropped, then what each database has recorded.
func (rc *ringCtx) render(w io.Writer, st idem.RingStatus) error {
	r := st.Ring
	var fields [][2]string
	switch {
	case r.Version == 0 && slices.ContainsFunc(st.Homes, func(h idem.HomeRing) bool { return h.Err != nil }):
		fields = append(fields, [2]string{"ring", "none found in the databases that could be read"})
	case r.Version == 0:
		fields = append(fields, [2]string{"ring", fmt.Sprintf("none recorded: 'd1idem ring init%s' records version 1 over the databases named", rc.hint())})
	case r.Phase == idem.RingMoving:
		fields = append(fields, [2]string{"ring", rc.set.describeRing(r)},
			[2]string{"moving", fmt.Sprintf("%s: those %s %s by rendezvous hashing. Their new keys go there;\nthe keys they have stay at their old homes, which are read first, until the drop.",
				ringShare(r), rc.set.labels(added(r)), pick(len(added(r)) == 1, "wins", "win"))},
			[2]string{"drop", rc.dropText(st)})
	default:
		fields = append(fields, [2]string{"ring", rc.set.describeRing(r)})
	}
	if err := printFields(w, fields); err != nil {
		return err
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(st.Homes))
	for _, h := range st.Homes {
		rows = append(rows, rc.homeRow(st, h))
	}
	for _, id := range notNamed(st) {
		rows = append(rows, []string{display(id), notNamedText, "-", "-"})
	}
	return printTable(w, []string{"DATABASE", "RECORDED", "SINCE", "KEYS"}, rows)
}

// homeRow is one database's row of the status table.
func (rc *ringCtx) homeRow(st idem.RingStatus, h idem.HomeRing) []string {
	label := rc.set.label(h.ID)
	inRing := slices.Contains(st.Ring.Homes, h.ID)
	switch {
	case h.Err != nil:
		return []string{label, "error: " + describe(h.Err), "-", "-"}
	case isLost(st, h):
		return []string{label, fmt.Sprintf("no identity, but version %d names it: the database was replaced or wiped; restore it (below)", st.Ring.Version), "-", yesNo(h.HasKeys)}
	case h.Identity != "" && h.Identity != h.ID:
		return []string{label, fmt.Sprintf("it recorded that it is home %s, not this one", h.Identity), "-", yesNo(h.HasKeys)}
	case h.Ring == nil && inRing:
		return []string{label, fmt.Sprintf("none, but version %d names it: 'd1idem ring advance' records it", st.Ring.Version), "-", yesNo(h.HasKeys)}
	case h.Ring == nil && st.Ring.Version > 0:
		return []string{label, "none: not in the ring", "-", yesNo(h.HasKeys)}
	case h.Ring == nil:
		return []string{label, "none", "-", yesNo(h.HasKeys)}
	}
	rec := fmt.Sprintf("version %d, %s", h.Ring.Version, h.Ring.Phase)
	if h.Ring.Epoch() < st.Ring.Epoch() {
		rec += fmt.Sprintf(" (behind version %d, %s: 'd1idem ring advance' records it)", st.Ring.Version, st.Ring.Phase)
	}
	since := fmt.Sprintf("%s (%s)", human.Time(h.RecordedAt), human.Age(h.Now.Sub(h.RecordedAt)))
	return []string{label, rec, since, yesNo(h.HasKeys)}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// clockOf is the ledger clock's time of a status: the latest of its
// databases' reads (this process's clock if none was read).
func clockOf(st idem.RingStatus) time.Time {
	var now time.Time
	for _, h := range st.Homes {
		if h.Err == nil && h.Now.After(now) {
			now = h.Now
		}
	}
	if now.IsZero() {
		return time.Now()
	}
	return now
}

// isLost says whether the ring names the database h read but it holds no
// identity: it was replaced or wiped (idem.ErrHomeLost).
func isLost(st idem.RingStatus, h idem.HomeRing) bool {
	return h.Err == nil && h.Identity == "" && slices.Contains(st.Ring.Homes, h.ID)
}

// lostError is ring status's error for the databases of the ring that lost
// their identity, or that recorded another; nil when there are none.
func (rc *ringCtx) lostError(st idem.RingStatus) error {
	var lost, other []string
	for _, h := range st.Homes {
		switch {
		case isLost(st, h):
			lost = append(lost, rc.set.label(h.ID))
		case h.Err == nil && h.Identity != "" && h.Identity != h.ID:
			other = append(other, fmt.Sprintf("%s recorded that it is home %s", rc.set.label(h.ID), h.Identity))
		}
	}
	switch {
	case len(lost) > 0:
		return fmt.Errorf("ring status: %s lost %s identity: replaced or wiped, with the keys %s held; restore %s to a moment before the loss with D1 Time Travel "+
			"('wrangler d1 time-travel restore %s --timestamp=TIME'), or name the home's own database again; no ring command records the ring there again, "+
			"which would execute those keys a second time (docs/sharding.md)",
			strings.Join(lost, ", "), pick(len(lost) == 1, "its", "their"), pick(len(lost) == 1, "it", "they"), pick(len(lost) == 1, "it", "them"), lost[0])
	case len(other) > 0:
		return fmt.Errorf("ring status: %s: give each home its own database, the same in every replica (docs/sharding.md)", strings.Join(other, "; "))
	}
	return nil
}
