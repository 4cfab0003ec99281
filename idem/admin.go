package idem

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Status is a ledger row's status: one of the spec's two, or anything else.
type Status string

// The spec's statuses.
const (
	StatusPending   Status = "pending"
	StatusCompleted Status = "completed"
)

// Valid reports whether s is one of the spec's statuses.
func (s Status) Valid() bool { return s == StatusPending || s == StatusCompleted }

// ParseStatus returns the status named s.
func ParseStatus(s string) (Status, error) {
	if st := Status(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("idem: %q is not a status: use %s or %s", s, StatusPending, StatusCompleted)
}

// Admin is the ledger's administrative API, which the d1idem CLI is built on.
type Admin struct{ l *Ledger }

// Admin returns the ledger's administrative API.
func (l *Ledger) Admin() *Admin { return &Admin{l: l} }

// ErrKeyNotFound is returned for a key the ledger has no row for.
var ErrKeyNotFound = errors.New("idem: no such key")

// ErrBadCursor is returned for a ListOptions.Cursor List did not hand out.
var ErrBadCursor = errors.New("idem: not a cursor of Admin.List")

// Limits of Admin.List.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// KeyRecord is a ledger row as the administrative API reads it. Its JSON
// form (MarshalJSON) has these fields' names, its times as RFC 3339 in UTC
// and as Unix milliseconds (created_at, created_at_ms, updated_at,
// updated_at_ms), its ages in milliseconds (age_ms, since_update_ms), and
// the stored headers decoded (response_headers) as well as raw.
type KeyRecord struct {
	Principal   string    `json:"principal"`
	Key         string    `json:"key"`
	Fingerprint string    `json:"fingerprint"`
	Status      Status    `json:"status"`
	State       KeyState  `json:"state"`      // under the TTL and heartbeat of the Admin that read it
	Generation  int64     `json:"generation"` // the fencing token
	CreatedAt   time.Time `json:"-"`
	UpdatedAt   time.Time `json:"-"`
	// The stored response (nil when NULL); headers (JSON) and body by Get only.
	ResponseStatus  *int64    `json:"response_status"`
	ResponseHeaders *string   `json:"response_headers_raw,omitempty"`
	ResponseBody    *string   `json:"response_body,omitempty"`
	AsOf            time.Time `json:"-"`     // the ledger clock's time of the read
	Stuck           bool      `json:"stuck"` // pending with no update for longer than the TTL
	// Home is, on a sharded ledger, the database Get or Release found the
	// row in: while the ring is moving, a moved principal's old home
	// until the old route is dropped. "" on a ledger of one database.
	Home string `json:"-"`
}

// Age is how long before AsOf the row was created.
func (k *KeyRecord) Age() time.Duration { return k.AsOf.Sub(k.CreatedAt) }

// SinceUpdate is how long before AsOf the row was last written.
func (k *KeyRecord) SinceUpdate() time.Duration { return k.AsOf.Sub(k.UpdatedAt) }

// StoredHeaders decodes ResponseHeaders; nil when there are none.
func (k *KeyRecord) StoredHeaders() (map[string]string, error) {
	if k.ResponseHeaders == nil {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(*k.ResponseHeaders), &h); err != nil {
		return nil, err
	}
	return h, nil
}

// The columns the administrative API reads (then the clock).
const (
	summaryColumns = "principal, key, fingerprint, status, generation, created_at, updated_at, response_status, "
	detailColumns  = ", response_headers, response_body"
	orderByUpdate  = " ORDER BY updated_at, principal, key"
)

func (a *Admin) scan(row d1client.Row, detail bool) (KeyRecord, error) {
	var k KeyRecord
	var created, updated, now int64
	dst := []any{&k.Principal, &k.Key, &k.Fingerprint, (*string)(&k.Status), &k.Generation, &created, &updated, &k.ResponseStatus, &now}
	if detail {
		dst = append(dst, &k.ResponseHeaders, &k.ResponseBody)
	}
	if err := row.Scan(dst...); err != nil {
		return k, fmt.Errorf("idem: reading a row: %w", err)
	}
	k.CreatedAt, k.UpdatedAt, k.AsOf = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC(), time.UnixMilli(now).UTC()
	k.Stuck = k.Status == StatusPending && updated < now-a.l.cfg.TTL.Milliseconds()
	k.State = a.l.cfg.stateOf(&k)
	return k, nil
}

// selectRows starts a read of summary rows (with the clock) from the table.
func (a *Admin) selectRows(detail bool) *query {
	q := a.l.sql.query(a.l.now()).add("SELECT " + summaryColumns).clock()
	if detail {
		q.add(detailColumns)
	}
	return q.add(" FROM " + d1idem.Table)
}

// stale appends "updated_at < now - d".
func stale(q *query, d time.Duration) *query {
	return q.add("updated_at < ").clock().add(" - ?", d.Milliseconds())
}

// Get reads one key's row, stored response included.
func (a *Admin) Get(ctx context.Context, principal, key string) (KeyRecord, error) {
	k, _, err := a.find(ctx, "get", principal, key, true)
	return k, err
}

// find reads a key's row (with detail, its response), and more's results.
func (a *Admin) find(ctx context.Context, op, principal, key string, detail bool, more ...d1client.Statement) (KeyRecord, []d1client.Result, error) {
	if err := checkPrincipal(principal); err != nil {
		return KeyRecord{}, nil, err
	}
	row := a.selectRows(detail).add(" WHERE principal = ? AND key = ?", principal, key).statement()
	res, home, err := a.l.findRow(ctx, principal, append([]d1client.Statement{row}, more...))
	switch {
	case err != nil:
		return KeyRecord{}, nil, fmt.Errorf("idem: %s: %w", op, err)
	case len(res[0].Rows) == 0:
		return KeyRecord{}, nil, ErrKeyNotFound
	}
	k, err := a.scan(res[0].Rows[0], detail)
	k.Home = home
	return k, res[1:], err
}

// ListOptions filters (all that are set) and pages Admin.List.
type ListOptions struct {
	Principal string        // only this principal's keys; "" for all
	Status    Status        // only keys with this status; "" for all
	OlderThan time.Duration // only keys last updated longer ago; 0 for any
	Limit     int           // 1 to MaxListLimit; 0 means DefaultListLimit
	Cursor    string        // a page's NextCursor, to continue after it (same filters)
}

// KeyPage is one page of Admin.List.
type KeyPage struct {
	Keys       []KeyRecord
	NextCursor string // continues with the next page; "" on the last one
}

// List pages through every database's rows (no responses) by last update, principal and key.
func (a *Admin) List(ctx context.Context, opts ListOptions) (KeyPage, error) {
	limit := cmp.Or(opts.Limit, DefaultListLimit)
	if limit < 1 || limit > MaxListLimit {
		return KeyPage{}, fmt.Errorf("idem: limit %d is out of range: use 1 to %d", limit, MaxListLimit)
	}
	if _, err := ParseStatus(string(opts.Status)); opts.Status != "" && err != nil {
		return KeyPage{}, err
	}
	if opts.OlderThan < 0 {
		return KeyPage{}, fmt.Errorf("idem: ListOptions.OlderThan %v is negative", opts.OlderThan)
	}
	q := a.selectRows(false).add(" WHERE principal <> ''") // not a reserved row
	cond := func() *query { return q.add(" AND ") }
	if opts.Principal != "" {
		cond().add("principal = ?", opts.Principal)
	}
	if opts.Status != "" {
		cond().add("status = ?", string(opts.Status))
	}
	if opts.OlderThan > 0 {
		stale(cond(), opts.OlderThan)
	}
	if opts.Cursor != "" {
		c, err := decodeCursor(opts.Cursor)
		if err != nil {
			return KeyPage{}, err
		}
		cond().add("(updated_at, principal, key) > (?, ?, ?)", c.UpdatedAt, c.Principal, c.Key)
	}
	q.add(orderByUpdate+" LIMIT ?", limit+1)
	res, err := a.at(ctx, opts.Principal, q.statement())
	if err != nil {
		return KeyPage{}, fmt.Errorf("idem: list: %w", err)
	}
	var keys []KeyRecord
	for _, r := range res {
		for _, row := range r[0].Rows {
			k, err := a.scan(row, false)
			if err != nil {
				return KeyPage{}, err
			}
			keys = append(keys, k)
		}
	}
	slices.SortStableFunc(keys, compareKeys)
	page := KeyPage{Keys: keys}
	if len(keys) > limit {
		page.Keys = keys[:limit]
		last := page.Keys[limit-1]
		page.NextCursor = cursor{UpdatedAt: last.UpdatedAt.UnixMilli(), Principal: last.Principal, Key: last.Key}.encode()
	}
	return page, nil
}

// ReleaseOptions adjusts Admin.Release.
type ReleaseOptions struct {
	// Force also releases a pending row updated within the TTL (fencing out
	// its owner), and a completed row, forgetting its response.
	Force bool
	// PendingOnly limits Force to a pending row: a row its owner completed
	// since it was read keeps its response (Released is false, Before says
	// completed). Set it to release a quiet owner's key, never to forget one.
	PendingOnly bool
}

// ReleaseResult is the answer of Admin.Release. Its JSON form
// (MarshalJSON) names the row, the generations before and after, and what
// was done: "expired" a pending row, "reset" a completed one.
type ReleaseResult struct {
	Released   bool      `json:"released"`      // whether the row was released
	Before     KeyRecord `json:"-"`             // the row as it was, read in the same transaction
	Generation int64     `json:"to_generation"` // the row's generation now
	Forced     bool      `json:"forced"`        // ReleaseOptions.Force was set
}

// Release releases a key at the given generation as Ledger.Release does (without Force, only if
// stuck); if not, Released is false and Before says why (another generation, completed, not stuck).
func (a *Admin) Release(ctx context.Context, principal, key string, generation int64, opts ReleaseOptions) (ReleaseResult, error) {
	mode := releaseStuck
	switch {
	case opts.Force && opts.PendingOnly:
		mode = releaseOwner // any pending row at the generation, never a completed one
	case opts.Force:
		mode = releaseForce
		a.l.cache.forget(principal, key) // this process no longer replays it
	}
	k, res, err := a.find(ctx, "release", principal, key, false, a.l.sql.release(principal, key, generation, a.l.cfg.TTL, mode, a.l.now()))
	if err != nil {
		return ReleaseResult{}, err
	}
	out := ReleaseResult{Before: k, Generation: k.Generation, Forced: opts.Force}
	if len(res[0].Rows) == 1 {
		out.Released = true
		if err := res[0].Rows[0].Scan(&out.Generation); err != nil {
			return out, fmt.Errorf("idem: release: reading the generation: %w", err)
		}
	}
	return out, nil
}

// Sweep runs the request path's sweep once in each database and counts the rows deleted.
func (a *Admin) Sweep(ctx context.Context) (int64, error) {
	l := a.l
	res, err := a.at(ctx, "", l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now()))
	var n int64
	for _, r := range res {
		if len(r) > 0 { // the homes that failed have no result
			n += r[0].Meta.Changes
		}
	}
	if n > 0 {
		l.tel.add(l.tel.swept, n, attrSweepSource.String("admin"))
	}
	if err != nil {
		return n, fmt.Errorf("idem: sweep: %w", err)
	}
	return n, nil
}

// SweepBacklog counts the rows last updated more than Retention ago.
func (a *Admin) SweepBacklog(ctx context.Context) (int64, error) {
	res, err := a.at(ctx, "", a.backlogStatement())
	if err != nil {
		return 0, fmt.Errorf("idem: sweep backlog: %w", err)
	}
	var total int64
	for _, r := range res {
		var n int64
		if err := r[0].Rows[0].Scan(&n); err != nil {
			return 0, fmt.Errorf("idem: sweep backlog: %w", err)
		}
		total += n
	}
	return total, nil
}

// Stats summarises the ledger. Its JSON form (MarshalJSON) has these
// fields' names, with TTL and Retention in milliseconds (ttl_ms,
// retention_ms).
type Stats struct {
	Keys         int64            `json:"keys"`          // rows in all
	ByStatus     map[Status]int64 `json:"by_status"`     // rows by status; the spec's two are always present
	Stuck        int64            `json:"stuck"`         // pending rows with no update for longer than the TTL
	OldestStuck  *KeyRecord       `json:"oldest_stuck"`  // the stuck row updated longest ago; nil if none
	Oldest       *KeyRecord       `json:"oldest"`        // the row updated longest ago; nil if none
	SweepBacklog int64            `json:"sweep_backlog"` // rows last updated more than Retention ago
	SizeBytes    int64            `json:"size_bytes"`    // the size D1 reports (meta size_after); 0 if none
	Created      int64            `json:"-"`             // rows created within the last Retention
	FirstCreated time.Time        `json:"-"`             // when the oldest row was created; zero if none
	AsOf         time.Time        `json:"-"`             // the ledger clock's time of the read
	// TTL and Retention are the ledger's, with which Stuck, SweepBacklog
	// and Created were counted.
	TTL, Retention time.Duration `json:"-"`
}

// OtherStatuses are the statuses of ByStatus that the ledger does not
// write (rows something else wrote, or edited by hand), sorted.
func (s Stats) OtherStatuses() []Status {
	var out []Status
	for status := range s.ByStatus {
		if !status.Valid() {
			out = append(out, status)
		}
	}
	slices.Sort(out)
	return out
}

// Stats totals the ledger's databases, one read-only D1 call each (billed for the whole table),
// and records each one's counts in the gauges of docs/observability.md.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	per, err := a.HomeStats(ctx)
	if err != nil {
		return Stats{}, err
	}
	return a.total(per), nil
}

// older returns the earlier of two rows in List's order; nil ones lose.
func older(a, b *KeyRecord) *KeyRecord {
	if a == nil || (b != nil && compareKeys(*b, *a) < 0) {
		return b
	}
	return a
}

// HomeStats is one database's share of a ledger's Stats.
type HomeStats struct {
	Home  string `json:"id"` // the database's ID (Home.ID)
	Stats Stats  `json:"stats"`
	Err   error  `json:"-"` // why the database could not be read (Overview only); Stats is then unset
}

// HomeStats summarises each database of the ring as Stats does.
func (a *Admin) HomeStats(ctx context.Context) ([]HomeStats, error) {
	hs, _, err := a.l.homesFor(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("idem: stats: %w", err)
	}
	out, err := eachHome(ctx, hs, func(ctx context.Context, h *home) (HomeStats, error) {
		s, err := a.statsAt(ctx, h)
		return HomeStats{Home: h.id, Stats: s}, err
	})
	if err != nil {
		return nil, fmt.Errorf("idem: stats: %w", err)
	}
	for _, s := range out {
		a.l.tel.stats(ctx, s.Home, s.Stats)
	}
	return out, nil
}

func (a *Admin) statsAt(ctx context.Context, h *home) (Stats, error) {
	l := a.l
	t := d1idem.Table
	byStatus := l.sql.query(l.now()).add("SELECT status, count(*) FROM " + t + " WHERE principal <> '' GROUP BY status ORDER BY status")
	counts := l.sql.query(l.now()).add("SELECT (SELECT count(*) FROM "+t+" WHERE status = ? AND ", string(StatusPending))
	stale(counts, l.cfg.TTL).add("), (SELECT count(*) FROM " + t + " WHERE ")
	stale(counts, l.cfg.Retention).add("), (SELECT count(*) FROM "+t+" WHERE principal <> '' AND created_at >= ").clock().
		add(" - ?), (SELECT min(created_at) FROM "+t+" WHERE principal <> ''), ", l.cfg.Retention.Milliseconds()).clock()
	oldest := a.selectRows(false).add(" WHERE principal <> ''" + orderByUpdate + " LIMIT 1")
	oldestStuck := stale(a.selectRows(false).add(" WHERE status = ? AND ", string(StatusPending)), l.cfg.TTL).add(orderByUpdate + " LIMIT 1")
	res, err := h.db.Exec(ctx, []d1client.Statement{byStatus.statement(), counts.statement(), oldest.statement(), oldestStuck.statement()})
	if err != nil {
		return Stats{}, err
	}
	out := Stats{ByStatus: map[Status]int64{StatusPending: 0, StatusCompleted: 0}, SizeBytes: res[0].Meta.SizeAfter, TTL: l.cfg.TTL, Retention: l.cfg.Retention}
	for _, r := range res[0].Rows {
		var status string
		var n int64
		if err := r.Scan(&status, &n); err != nil {
			return Stats{}, fmt.Errorf("reading the counts: %w", err)
		}
		out.ByStatus[Status(status)] = n
		out.Keys += n
	}
	var first *int64
	var now int64
	if err := res[1].Rows[0].Scan(&out.Stuck, &out.SweepBacklog, &out.Created, &first, &now); err != nil {
		return Stats{}, fmt.Errorf("reading the counts: %w", err)
	}
	out.AsOf = time.UnixMilli(now).UTC()
	if first != nil {
		out.FirstCreated = time.UnixMilli(*first).UTC()
	}
	for i, dst := range []**KeyRecord{&out.Oldest, &out.OldestStuck} {
		if rows := res[2+i].Rows; len(rows) > 0 {
			k, err := a.scan(rows[0], false)
			if err != nil {
				return Stats{}, err
			}
			*dst = &k
		}
	}
	return out, nil
}

// compareKeys orders rows as List does (BINARY collation: bytes, as in Go).
func compareKeys(a, b KeyRecord) int {
	return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), cmp.Compare(a.Principal, b.Principal), cmp.Compare(a.Key, b.Key))
}

// eachHome runs fn at each home at once; the error joins their failures.
func eachHome[T any](ctx context.Context, hs []*home, fn func(ctx context.Context, h *home) (T, error)) ([]T, error) {
	out := make([]T, len(hs))
	errs := make([]error, len(hs))
	if len(hs) == 1 {
		out[0], errs[0] = fn(ctx, hs[0])
		return out, errs[0]
	}
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Go(func() {
			out[i], errs[i] = fn(ctx, h)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("home %s: %w", h.id, errs[i])
			}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// at runs stmts as one idempotent call at each of homesFor's databases.
func (a *Admin) at(ctx context.Context, principal string, stmts ...d1client.Statement) ([][]d1client.Result, error) {
	hs, _, err := a.l.homesFor(ctx, principal)
	if err != nil {
		return nil, err
	}
	return eachHome(ctx, hs, func(ctx context.Context, h *home) ([]d1client.Result, error) {
		return h.db.Exec(ctx, stmts, d1client.Idempotent())
	})
}

// cursor is a position in List's order: after this row.
type cursor struct {
	UpdatedAt int64
	Principal string
	Key       string
}

func (c cursor) encode() string {
	payload, _ := json.Marshal([]any{c.UpdatedAt, c.Principal, c.Key})
	return cursorToken(payload)
}

// cursorToken is "v1." + base64url(JSON [updated_at, principal, key]) + "." +
// the first 8 hex digits of the JSON's SHA-256 (against editing).
func cursorToken(payload []byte) string {
	sum := sha256.Sum256(payload)
	return "v1." + base64.RawURLEncoding.EncodeToString(payload) + "." + hex.EncodeToString(sum[:4])
}

func decodeCursor(tok string) (cursor, error) {
	_, b64, _ := strings.Cut(tok, ".")
	b64, _, _ = strings.Cut(b64, ".")
	payload, err := base64.RawURLEncoding.DecodeString(b64)
	var c cursor
	fields := []any{&c.UpdatedAt, &c.Principal, &c.Key} // decoded in place
	if err != nil || cursorToken(payload) != tok || json.Unmarshal(payload, &fields) != nil || len(fields) != 3 {
		return cursor{}, ErrBadCursor
	}
	return c, nil
}
