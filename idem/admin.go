package idem

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// Status is the status of a ledger row. The spec has two; a row written by
// something else may hold any string.
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

// Admin is the ledger's administrative API, which the d1idem CLI is built
// on: it reads rows, releases keys and sweeps, with its Ledger's clock, TTL
// and retention (configure them as the application does).
type Admin struct{ l *Ledger }

// Admin returns the ledger's administrative API.
func (l *Ledger) Admin() *Admin { return &Admin{l: l} }

// ErrKeyNotFound is returned for a key the ledger has no row for.
var ErrKeyNotFound = errors.New("idem: no such key")

// ErrBadCursor is returned for a ListOptions.Cursor that List did not hand
// out.
var ErrBadCursor = errors.New("idem: not a cursor of Admin.List")

// Limits of Admin.List and Admin.Stuck.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// KeyRecord is a ledger row as the administrative API reads it.
type KeyRecord struct {
	Principal   string
	Key         string
	Fingerprint string
	Status      Status
	Generation  int64 // the fencing token
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// ResponseStatus is the stored status of a completed row; nil when NULL.
	ResponseStatus *int64
	// ResponseHeaders (the stored JSON object) and ResponseBody are read by
	// Get only; nil when NULL.
	ResponseHeaders *string
	ResponseBody    *string
	// AsOf is the ledger clock's time of the read.
	AsOf time.Time
	// Stuck reports a pending row with no update for longer than the TTL:
	// its owner is presumed dead, and the next request with the same
	// fingerprint takes it over.
	Stuck bool
}

// Age is how long before AsOf the row was created.
func (k *KeyRecord) Age() time.Duration { return k.AsOf.Sub(k.CreatedAt) }

// SinceUpdate is how long before AsOf the row was last written (claimed,
// taken over, renewed, completed or released).
func (k *KeyRecord) SinceUpdate() time.Duration { return k.AsOf.Sub(k.UpdatedAt) }

// StoredHeaders decodes ResponseHeaders, the stored JSON object of replay
// headers; nil when there is none, and the JSON error when it is not one.
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

// The columns every read of the administrative API selects, then the
// clock; Get adds the stored response.
const (
	summaryColumns = "principal, key, fingerprint, status, generation, created_at, updated_at, response_status, "
	detailColumns  = ", response_headers, response_body"
	orderByUpdate  = " ORDER BY updated_at, principal, key"
)

func (a *Admin) scan(row d1client.Row, detail bool) (KeyRecord, error) {
	var k KeyRecord
	var status string
	var created, updated, now int64
	dst := []any{&k.Principal, &k.Key, &k.Fingerprint, &status, &k.Generation, &created, &updated, &k.ResponseStatus, &now}
	if detail {
		dst = append(dst, &k.ResponseHeaders, &k.ResponseBody)
	}
	if err := row.Scan(dst...); err != nil {
		return k, fmt.Errorf("idem: reading a row: %w", err)
	}
	k.Status = Status(status)
	k.CreatedAt, k.UpdatedAt, k.AsOf = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC(), time.UnixMilli(now).UTC()
	// The claim's takeover condition: updated_at < now - TTL.
	k.Stuck = k.Status == StatusPending && updated < now-a.l.cfg.TTL.Milliseconds()
	return k, nil
}

// mergeRows reads the rows of each database's first result, each in List's
// order, and merges them, keeping the first n.
func (a *Admin) mergeRows(res [][]d1client.Result, n int) ([]KeyRecord, error) {
	var out []KeyRecord
	for _, r := range res {
		keys := make([]KeyRecord, 0, len(r[0].Rows))
		for _, row := range r[0].Rows {
			k, err := a.scan(row, false)
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
		out = mergeKeys(out, keys, n)
	}
	return out, nil
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

// Get reads one key's row, stored response included, or returns
// ErrKeyNotFound.
func (a *Admin) Get(ctx context.Context, principal, key string) (KeyRecord, error) {
	if err := checkPrincipal(principal); err != nil {
		return KeyRecord{}, err
	}
	res, err := a.l.findRow(ctx, principal, []d1client.Statement{a.selectRows(true).add(" WHERE principal = ? AND key = ?", principal, key).statement()})
	if err != nil {
		return KeyRecord{}, fmt.Errorf("idem: get: %w", err)
	}
	if len(res[0].Rows) == 0 {
		return KeyRecord{}, ErrKeyNotFound
	}
	return a.scan(res[0].Rows[0], true)
}

// ListOptions filters and pages Admin.List. Filters combine.
type ListOptions struct {
	Principal string        // only this principal's keys; "" for all
	Status    Status        // only keys with this status; "" for all
	OlderThan time.Duration // only keys last updated longer ago; 0 for any
	// Limit bounds the page: 1 to MaxListLimit; 0 means DefaultListLimit.
	Limit int
	// Cursor continues after the page that returned it as NextCursor (with
	// the same filters); "" starts at the beginning.
	Cursor string
}

// KeyPage is one page of Admin.List.
type KeyPage struct {
	Keys []KeyRecord
	// NextCursor continues with the next page; "" on the last one.
	NextCursor string
}

// List returns rows ordered by their last update, then principal and key,
// without their stored responses, from every database of the ledger. Pages
// are keyset-paginated: stable while rows are added, updated or deleted.
func (a *Admin) List(ctx context.Context, opts ListOptions) (KeyPage, error) {
	limit, err := listLimit(opts.Limit)
	if err != nil {
		return KeyPage{}, err
	}
	if opts.Status != "" && !opts.Status.Valid() {
		_, err := ParseStatus(string(opts.Status))
		return KeyPage{}, err
	}
	if opts.OlderThan < 0 {
		return KeyPage{}, fmt.Errorf("idem: ListOptions.OlderThan %v is negative", opts.OlderThan)
	}
	var after *cursor
	if opts.Cursor != "" {
		c, err := decodeCursor(opts.Cursor)
		if err != nil {
			return KeyPage{}, err
		}
		after = &c
	}
	q := a.selectRows(false).add(" WHERE principal <> ''") // not a sharded ledger's ring
	cond := func() *query { return q.add(" AND ") }
	homes := a.l.ringHomes
	if opts.Principal != "" {
		homes = func(ctx context.Context) ([]*home, error) { return a.l.principalHomes(ctx, opts.Principal) }
		cond().add("principal = ?", opts.Principal)
	}
	if opts.Status != "" {
		cond().add("status = ?", string(opts.Status))
	}
	if opts.OlderThan > 0 {
		stale(cond(), opts.OlderThan)
	}
	if after != nil {
		cond().add("(updated_at, principal, key) > (?, ?, ?)", after.UpdatedAt, after.Principal, after.Key)
	}
	q.add(orderByUpdate+" LIMIT ?", limit+1)
	res, err := a.at(ctx, homes, q.statement())
	if err != nil {
		return KeyPage{}, fmt.Errorf("idem: list: %w", err)
	}
	keys, err := a.mergeRows(res, limit+1)
	if err != nil {
		return KeyPage{}, err
	}
	page := KeyPage{Keys: keys}
	if len(keys) > limit {
		page.Keys = keys[:limit]
		last := page.Keys[limit-1]
		page.NextCursor = cursor{UpdatedAt: last.UpdatedAt.UnixMilli(), Principal: last.Principal, Key: last.Key}.encode()
	}
	return page, nil
}

func listLimit(n int) (int, error) {
	if n == 0 {
		return DefaultListLimit, nil
	}
	if n < 1 || n > MaxListLimit {
		return 0, fmt.Errorf("idem: limit %d is out of range: use 1 to %d", n, MaxListLimit)
	}
	return n, nil
}

// StuckKeys is the answer of Admin.Stuck.
type StuckKeys struct {
	Keys  []KeyRecord // the oldest stuck keys, oldest first
	Total int64       // how many keys are stuck in all
}

// Stuck returns the pending keys with no update for longer than the TTL,
// oldest first, at most limit (0: DefaultListLimit), and how many there are.
func (a *Admin) Stuck(ctx context.Context, limit int) (StuckKeys, error) {
	limit, err := listLimit(limit)
	if err != nil {
		return StuckKeys{}, err
	}
	list := stale(a.selectRows(false).add(" WHERE status = ? AND ", string(StatusPending)), a.l.cfg.TTL).
		add(orderByUpdate+" LIMIT ?", limit)
	count := stale(a.l.sql.query(a.l.now()).add("SELECT count(*) FROM "+d1idem.Table+" WHERE status = ? AND ", string(StatusPending)), a.l.cfg.TTL)
	res, err := a.at(ctx, a.l.ringHomes, list.statement(), count.statement())
	if err != nil {
		return StuckKeys{}, fmt.Errorf("idem: stuck: %w", err)
	}
	var out StuckKeys
	if out.Keys, err = a.mergeRows(res, limit); err != nil {
		return StuckKeys{}, err
	}
	for _, r := range res {
		var n int64
		if err := r[1].Rows[0].Scan(&n); err != nil {
			return StuckKeys{}, fmt.Errorf("idem: stuck: reading the count: %w", err)
		}
		out.Total += n
	}
	return out, nil
}

// ReleaseOptions adjusts Admin.Release.
type ReleaseOptions struct {
	// Force also releases a pending row updated within the TTL (its owner,
	// probably alive, will find its lease lost and be fenced out), and a
	// completed row, whose response is forgotten: the next request with
	// the same fingerprint executes again.
	Force bool
}

// ReleaseResult is the answer of Admin.Release.
type ReleaseResult struct {
	// Released reports whether the row was released.
	Released bool
	// Before is the row as it was, read in the same transaction.
	Before KeyRecord
	// Generation is the row's generation now: Before.Generation + 1 when
	// released.
	Generation int64
}

// Release releases one key at the given generation, with the ledger's one
// release rule (see Ledger.Release): the row moves one generation on, pending
// with no response, so the client's next request with the same fingerprint
// takes it over at once and executes; another fingerprint is still refused
// as a reused key. Without Force only a stuck row is released. Released is
// false, and Before says why, when the row is at another generation,
// completed, or (without Force) not stuck; a missing row is ErrKeyNotFound.
func (a *Admin) Release(ctx context.Context, principal, key string, generation int64, opts ReleaseOptions) (ReleaseResult, error) {
	mode := releaseStuck
	if opts.Force {
		mode = releaseForce
	}
	if err := checkPrincipal(principal); err != nil {
		return ReleaseResult{}, err
	}
	before := a.selectRows(false).add(" WHERE principal = ? AND key = ?", principal, key)
	release := a.l.sql.release(principal, key, generation, a.l.cfg.TTL, mode, a.l.now())
	res, err := a.l.findRow(ctx, principal, []d1client.Statement{before.statement(), release})
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("idem: release: %w", err)
	}
	if len(res[0].Rows) == 0 {
		return ReleaseResult{}, ErrKeyNotFound
	}
	k, err := a.scan(res[0].Rows[0], false)
	if err != nil {
		return ReleaseResult{}, err
	}
	out := ReleaseResult{Before: k, Generation: k.Generation}
	if len(res[1].Rows) == 1 {
		out.Released = true
		if err := res[1].Rows[0].Scan(&out.Generation); err != nil {
			return out, fmt.Errorf("idem: release: reading the generation: %w", err)
		}
	}
	return out, nil
}

// Sweep deletes up to SweepBatch rows last updated more than Retention ago
// in each database of the ledger, with the spec's bounded DELETE, and
// returns how many it deleted; the error names the databases that failed.
// The request path sweeps on its own; Sweep is for clearing a backlog.
func (a *Admin) Sweep(ctx context.Context) (int64, error) {
	l := a.l
	res, err := a.at(ctx, l.ringHomes, l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now()))
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

// SweepBacklog counts the rows the sweep would delete: those last updated
// more than Retention ago.
func (a *Admin) SweepBacklog(ctx context.Context) (int64, error) {
	q := stale(a.l.sql.query(a.l.now()).add("SELECT count(*) FROM "+d1idem.Table+" WHERE "), a.l.cfg.Retention)
	res, err := a.at(ctx, a.l.ringHomes, q.statement())
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

// Stats summarises the ledger.
type Stats struct {
	Keys         int64            // rows in all
	ByStatus     map[Status]int64 // rows by status; the spec's two are always present
	Stuck        int64            // pending rows with no update for longer than the TTL
	OldestStuck  *KeyRecord       // the stuck row updated longest ago; nil if none
	Oldest       *KeyRecord       // the row updated longest ago; nil if none
	SweepBacklog int64            // rows last updated more than Retention ago
	// SizeBytes is the database size D1 reports (its meta size_after); 0
	// when D1 does not report it.
	SizeBytes int64
	// Created counts the rows created within the last Retention, and
	// FirstCreated is when the oldest was (zero if none): with AsOf, the
	// ledger clock's time of the read, they measure the write rate.
	Created      int64
	FirstCreated time.Time
	AsOf         time.Time
}

// Stats summarises the ledger in one read-only D1 call per database (the
// totals of a sharded ledger: see HomeStats). Counting reads the whole table,
// which D1 bills as rows read. Stats and HomeStats record each database's
// counts in the gauges of docs/observability.md: an application that alerts
// on stuck keys calls Stats periodically, from one replica.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	per, err := a.HomeStats(ctx)
	if err != nil {
		return Stats{}, err
	}
	if len(per) == 1 {
		return per[0].Stats, nil
	}
	out := Stats{ByStatus: map[Status]int64{}}
	for _, p := range per {
		s := p.Stats
		out.Keys += s.Keys
		out.Stuck += s.Stuck
		out.SweepBacklog += s.SweepBacklog
		out.SizeBytes += s.SizeBytes
		out.Created += s.Created
		if !s.FirstCreated.IsZero() && (out.FirstCreated.IsZero() || s.FirstCreated.Before(out.FirstCreated)) {
			out.FirstCreated = s.FirstCreated
		}
		if s.AsOf.After(out.AsOf) {
			out.AsOf = s.AsOf
		}
		for st, n := range s.ByStatus {
			out.ByStatus[st] += n
		}
		out.Oldest = older(out.Oldest, s.Oldest)
		out.OldestStuck = older(out.OldestStuck, s.OldestStuck)
	}
	return out, nil
}

// older returns the earlier of two rows in List's order; nil ones lose.
func older(a, b *KeyRecord) *KeyRecord {
	if a == nil || (b != nil && keyBefore(*b, *a)) {
		return b
	}
	return a
}

// HomeStats is one database's share of a ledger's Stats.
type HomeStats struct {
	Home  string // the database's ID (Home.ID)
	Stats Stats
}

// HomeStats summarises each database of the ledger (of its ring, for a
// sharded ledger) in one read-only D1 call each, in the ring's order.
func (a *Admin) HomeStats(ctx context.Context) ([]HomeStats, error) {
	hs, err := a.l.ringHomes(ctx)
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
	out := Stats{ByStatus: map[Status]int64{StatusPending: 0, StatusCompleted: 0}, SizeBytes: res[0].Meta.SizeAfter}
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

// keyBefore reports whether a comes before b in List's order (SQLite's
// BINARY collation compares bytes, as Go compares strings).
func keyBefore(a, b KeyRecord) bool {
	if x, y := a.UpdatedAt.UnixMilli(), b.UpdatedAt.UnixMilli(); x != y {
		return x < y
	}
	if a.Principal != b.Principal {
		return a.Principal < b.Principal
	}
	return a.Key < b.Key
}

// mergeKeys merges two lists in List's order and keeps the first n.
func mergeKeys(a, b []KeyRecord, n int) []KeyRecord {
	out := make([]KeyRecord, 0, min(len(a)+len(b), n))
	for len(out) < n && (len(a) > 0 || len(b) > 0) {
		if len(b) == 0 || (len(a) > 0 && !keyBefore(b[0], a[0])) {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// eachHome runs fn for each home at once and returns their results in
// order; the error joins each failure, named by its home.
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

// at runs stmts, as one idempotent call, at each of the databases homes
// returns, at once (see eachHome).
func (a *Admin) at(ctx context.Context, homes func(context.Context) ([]*home, error), stmts ...d1client.Statement) ([][]d1client.Result, error) {
	hs, err := homes(ctx)
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

// A cursor token is "v1." + base64url(JSON [updated_at, principal, key]) +
// "." + the first 8 hex digits of the JSON's SHA-256, which catches a token
// cut short or edited by hand.
const cursorVersion = "v1"

func (c cursor) encode() string {
	payload, _ := json.Marshal([]any{c.UpdatedAt, c.Principal, c.Key})
	return cursorToken(payload)
}

func cursorToken(payload []byte) string {
	sum := sha256.Sum256(payload)
	return cursorVersion + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + hex.EncodeToString(sum[:4])
}

func decodeCursor(tok string) (cursor, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != cursorVersion {
		return cursor{}, ErrBadCursor
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return cursor{}, ErrBadCursor
	}
	sum := sha256.Sum256(payload)
	if hex.EncodeToString(sum[:4]) != parts[2] {
		return cursor{}, ErrBadCursor
	}
	var fields []json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil || len(fields) != 3 {
		return cursor{}, ErrBadCursor
	}
	var c cursor
	if json.Unmarshal(fields[0], &c.UpdatedAt) != nil || json.Unmarshal(fields[1], &c.Principal) != nil || json.Unmarshal(fields[2], &c.Key) != nil {
		return cursor{}, ErrBadCursor
	}
	return c, nil
}
