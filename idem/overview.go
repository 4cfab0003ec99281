package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/d1idem/d1idem/internal/human"
)

// Overview is a ledger at a glance: each of its databases' Stats, or why
// they could not be read, and the total of those that could. It is what
// the d1idem command line's stats prints.
type Overview struct {
	Total Stats       // the databases that could be read, added up
	Homes []HomeStats // every database the ledger was given, by ID
}

// Err is the first database's error, nil when every database was read.
func (o Overview) Err() error {
	for _, h := range o.Homes {
		if h.Err != nil {
			return fmt.Errorf("home %s: %w", h.Home, h.Err)
		}
	}
	return nil
}

// Overview reads the Stats of every database the ledger was given (New's
// one, or each of NewSharded's Homes, whether or not the ring names it:
// no ring needs to be recorded), one read-only D1 call each, at once. A
// database that cannot be read has its error in its HomeStats, and the
// total leaves it out; Overview fails only when ctx ends. Like Stats, it
// records each database's counts in the gauges of docs/observability.md.
func (a *Admin) Overview(ctx context.Context) (Overview, error) {
	hs := a.l.givenHomes()
	out := Overview{Homes: make([]HomeStats, len(hs))}
	per, _ := eachHome(ctx, hs, func(ctx context.Context, h *home) (HomeStats, error) {
		s, err := a.statsAt(ctx, h)
		return HomeStats{Home: h.id, Stats: s, Err: err}, nil
	})
	for i, p := range per {
		out.Homes[i] = p
		if p.Err == nil {
			a.l.tel.stats(ctx, p.Home, p.Stats)
		}
	}
	out.Total = a.total(out.Homes)
	return out, ctx.Err()
}

// givenHomes are every database the ledger was given: New's one, or
// NewSharded's Homes in the order of their IDs.
func (l *Ledger) givenHomes() []*home {
	if l.single != nil {
		return []*home{l.single}
	}
	hs := make([]*home, len(l.shards.ids))
	for i, id := range l.shards.ids {
		hs[i] = l.shards.homes[id]
	}
	return hs
}

// total adds up the Stats of the databases that could be read.
func (a *Admin) total(per []HomeStats) Stats {
	out := Stats{ByStatus: map[Status]int64{StatusPending: 0, StatusCompleted: 0}, TTL: a.l.cfg.TTL, Retention: a.l.cfg.Retention}
	for _, p := range per {
		if p.Err != nil {
			continue
		}
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
	return out
}

// D1MaxBytes is D1's limit on the size of one database: 10 GB (10^10
// bytes), which cannot be raised.
const D1MaxBytes = 10_000_000_000

// The least sample Stats.Projection measures a write rate from.
const (
	MinSampleRows = 100
	MinSampleSpan = time.Hour
)

// Projection is when a database would reach D1's size limit at the rate
// its rows are being written. The estimate: rows per day are the rows
// created within the retention, over the time they span (the retention, or
// less when the oldest row is younger); bytes per row are the database's
// size over its rows (an overestimate, since the size includes SQLite's
// fixed pages and any other table). Rows stay for the retention after
// their last update, so at that rate the database levels off at rows per
// day x the retention in days x bytes per row; while it fills up to that,
// it grows by rows per day x bytes per row a day. If it levels off above
// the limit, the days to the limit are what is left of it over that
// growth; if below, it never reaches the limit at this rate.
type Projection struct {
	// Reason says why there is no estimate: too few rows, too short a
	// span, or no size reported. "" when there is one.
	Reason      string
	RowsPerDay  float64
	BytesPerRow float64
	// LevelBytes is the size at which the database levels off at this
	// rate.
	LevelBytes float64
	// Reaches reports that it reaches the limit, in Days (0: it has).
	Reaches bool
	Days    float64
	// Retention is the Stats' retention, which the estimate assumes.
	Retention time.Duration
}

// Projection estimates when the one database these Stats are of reaches
// D1's size limit, its rows staying for s.Retention. (Of a total over
// several databases it means nothing: the limit is per database.)
func (s Stats) Projection() Projection {
	p := s.projection()
	p.Retention = s.Retention
	return p
}

func (s Stats) projection() Projection {
	switch {
	case s.SizeBytes <= 0:
		return Projection{Reason: "D1 reported no database size"}
	case s.SizeBytes >= D1MaxBytes:
		return Projection{Reaches: true}
	case s.Keys == 0 || s.FirstCreated.IsZero():
		return Projection{Reason: "no rows yet"}
	}
	span := min(s.Retention, s.AsOf.Sub(s.FirstCreated))
	switch {
	case span < MinSampleSpan:
		return Projection{Reason: fmt.Sprintf("the oldest row was created %s ago; the rate needs %s of writes", human.Duration(max(span, 0)), human.Duration(MinSampleSpan))}
	case s.Created < MinSampleRows:
		rows := "rows"
		if s.Created == 1 {
			rows = "row"
		}
		return Projection{Reason: fmt.Sprintf("%d %s created in the last %s; the rate needs %d", s.Created, rows, human.Duration(span), MinSampleRows)}
	}
	day := 24 * time.Hour
	p := Projection{
		RowsPerDay:  float64(s.Created) * float64(day) / float64(span),
		BytesPerRow: float64(s.SizeBytes) / float64(s.Keys),
	}
	p.LevelBytes = p.RowsPerDay * float64(s.Retention) / float64(day) * p.BytesPerRow
	if p.LevelBytes >= D1MaxBytes {
		p.Reaches = true
		p.Days = (D1MaxBytes - float64(s.SizeBytes)) / (p.RowsPerDay * p.BytesPerRow)
	}
	return p
}

// MarshalJSON writes the projection with D1's limit (limit_bytes), and
// null for what it does not know: not_enough_data (the Reason, when there
// is one), rows_per_day, bytes_per_row, level_bytes, reaches_limit and
// days_to_limit.
func (p Projection) MarshalJSON() ([]byte, error) {
	out := struct {
		LimitBytes   int64    `json:"limit_bytes"`
		Reason       *string  `json:"not_enough_data"`
		RowsPerDay   *float64 `json:"rows_per_day"`
		BytesPerRow  *float64 `json:"bytes_per_row"`
		LevelBytes   *float64 `json:"level_bytes"`
		ReachesLimit bool     `json:"reaches_limit"`
		DaysToLimit  *float64 `json:"days_to_limit"`
	}{LimitBytes: D1MaxBytes, ReachesLimit: p.Reaches}
	switch {
	case p.Reason != "":
		out.Reason = &p.Reason
	case p.RowsPerDay > 0:
		out.RowsPerDay, out.BytesPerRow, out.LevelBytes = &p.RowsPerDay, &p.BytesPerRow, &p.LevelBytes
	}
	if p.Reaches && p.Reason == "" {
		out.DaysToLimit = &p.Days
	}
	return json.Marshal(out)
}

// statsJSON is Stats' JSON form: its fields, and TTL and Retention in
// milliseconds.
type statsJSON struct {
	statsFields
	TTLMS       int64 `json:"ttl_ms"`
	RetentionMS int64 `json:"retention_ms"`
}

// statsFields are Stats' fields, without its MarshalJSON.
type statsFields Stats

func (s Stats) json() statsJSON {
	if s.ByStatus == nil {
		s.ByStatus = map[Status]int64{}
	}
	return statsJSON{statsFields(s), s.TTL.Milliseconds(), s.Retention.Milliseconds()}
}

// MarshalJSON writes the stats with the names of Stats' fields, TTL and
// Retention as ttl_ms and retention_ms.
func (s Stats) MarshalJSON() ([]byte, error) { return json.Marshal(s.json()) }

// MarshalJSON writes the row's fields, its times in UTC with milliseconds
// and as Unix milliseconds, its ages in milliseconds, and its stored
// headers decoded (response_headers) and its body's length
// (response_body_bytes) when they were read.
func (k KeyRecord) MarshalJSON() ([]byte, error) {
	type fields KeyRecord
	var headers *map[string]string // {} for stored headers that are none
	if h, err := k.StoredHeaders(); err == nil && k.ResponseHeaders != nil {
		headers = &h
	}
	var bodyBytes *int
	if k.ResponseBody != nil {
		n := len(*k.ResponseBody)
		bodyBytes = &n
	}
	return json.Marshal(struct {
		fields
		CreatedAt     string             `json:"created_at"`
		CreatedAtMS   int64              `json:"created_at_ms"`
		UpdatedAt     string             `json:"updated_at"`
		UpdatedAtMS   int64              `json:"updated_at_ms"`
		AgeMS         int64              `json:"age_ms"`
		SinceUpdateMS int64              `json:"since_update_ms"`
		Headers       *map[string]string `json:"response_headers,omitempty"`
		BodyBytes     *int               `json:"response_body_bytes,omitempty"`
	}{fields(k), human.Time(k.CreatedAt), k.CreatedAt.UnixMilli(), human.Time(k.UpdatedAt), k.UpdatedAt.UnixMilli(),
		k.Age().Milliseconds(), k.SinceUpdate().Milliseconds(), headers, bodyBytes})
}

// MarshalJSON writes whether the row was released, the row (principal,
// key), its generation before (from_generation) and now (to_generation),
// what was done (action: "expired" for a pending row, "reset" for a
// completed one, whose response is forgotten), its status before
// (from_status), and after a release its status and state (pending,
// awaiting_retry), the generation the retry that takes it over runs at
// (takeover_generation), and its ages before.
func (r ReleaseResult) MarshalJSON() ([]byte, error) {
	type fields ReleaseResult
	k := &r.Before
	action, status, state := "expired", k.Status, k.State
	if k.Status == StatusCompleted {
		action = "reset"
	}
	if r.Released {
		status, state = StatusPending, KeyAwaitingRetry
	}
	return json.Marshal(struct {
		fields
		Principal          string   `json:"principal"`
		Key                string   `json:"key"`
		FromGeneration     int64    `json:"from_generation"`
		TakeoverGeneration int64    `json:"takeover_generation"`
		Action             string   `json:"action"`
		FromStatus         Status   `json:"from_status"`
		Status             Status   `json:"status"`
		State              KeyState `json:"state"`
		SinceUpdateMS      int64    `json:"since_update_ms"`
		AgeMS              int64    `json:"age_ms"`
	}{fields(r), k.Principal, k.Key, k.Generation, r.Generation + 1, action, k.Status, status, state,
		k.SinceUpdate().Milliseconds(), k.Age().Milliseconds()})
}
