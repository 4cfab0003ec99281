package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
)

// SweepOptions adjust Admin.SweepAll.
type SweepOptions struct {
	// MaxBatches bounds the batches of each database: 1 sweeps one batch
	// of each; 0 sweeps until every backlog is clear.
	MaxBatches int
	// DryRun counts each database's backlog (one COUNT query each) and
	// deletes nothing.
	DryRun bool
	// Progress, if set, is called before a batch that must first wait for
	// the API budget (Wait set), and after each batch.
	Progress func(SweepProgress)
}

// SweepProgress is how far a SweepAll has got.
type SweepProgress struct {
	Home    string        // the database of the batch
	Deleted int64         // the rows deleted so far, from every database
	Batches int64         // the batches so far
	Wait    time.Duration // before a batch: how long it waits for the API budget
}

// SweepResult is what Admin.SweepAll did, in all and in each database.
type SweepResult struct {
	Deleted  int64 `json:"deleted"`
	Batches  int64 `json:"batches"`
	Complete bool  `json:"complete"` // every database's last batch came back short: the backlog is clear
	// Backlog is, for a dry run, the rows the sweep would delete.
	Backlog int64       `json:"-"`
	Homes   []HomeSweep `json:"databases"`
}

// HomeSweep is one database's share of a SweepAll.
type HomeSweep struct {
	Home     string `json:"id"`
	Deleted  int64  `json:"deleted"`
	Batches  int64  `json:"batches"`
	Complete bool   `json:"complete"`
	Backlog  *int64 `json:"would_delete,omitempty"` // for a dry run, the rows the sweep would delete
}

// HomeError is the failure of one database of a ledger.
type HomeError struct {
	Home string // the database's ID
	Err  error
}

func (e *HomeError) Error() string { return fmt.Sprintf("home %s: %v", e.Home, e.Err) }
func (e *HomeError) Unwrap() error { return e.Err }

// SweepAll deletes the rows last updated more than Retention ago from every
// database the ledger was given, in batches of SweepBatch (the request
// path's bounded DELETE), one database's batch after another's, since they
// share the account's API budget: until each database's batch comes back
// short (its backlog is clear), MaxBatches of each, or ctx ends. It is the
// loop a cron job of the application can run to clear a backlog; the d1idem
// sweep command runs it. Its D1 client's budget paces it: SweepAll says
// through Progress when a batch waits for it. On an error (a *HomeError
// naming the database) the result says what was done before it.
func (a *Admin) SweepAll(ctx context.Context, opts SweepOptions) (SweepResult, error) {
	hs := a.l.givenHomes()
	res := SweepResult{Homes: make([]HomeSweep, len(hs))}
	for i, h := range hs {
		res.Homes[i].Home = h.id
	}
	if opts.DryRun {
		return a.countBacklog(ctx, hs, res)
	}
	for round := 1; ; round++ {
		res.Complete = true
		for i, h := range hs {
			if res.Homes[i].Complete {
				continue
			}
			if err := a.sweepBatch(ctx, h, &res, &res.Homes[i], opts.Progress); err != nil {
				res.Complete = false
				return res, &HomeError{Home: h.id, Err: err}
			}
			res.Complete = res.Complete && res.Homes[i].Complete
		}
		if res.Complete || round == opts.MaxBatches {
			return res, nil
		}
	}
}

// sweepBatch sweeps one batch of h, first saying through progress how long
// it waits for the API budget, if it must.
func (a *Admin) sweepBatch(ctx context.Context, h *home, res *SweepResult, hr *HomeSweep, progress func(SweepProgress)) error {
	l := a.l
	if b, ok := h.db.(interface{ BudgetWait() time.Duration }); ok && progress != nil {
		if w := b.BudgetWait(); w > 0 {
			progress(SweepProgress{Home: h.id, Deleted: res.Deleted, Batches: res.Batches, Wait: w})
		}
	}
	r, err := h.db.Exec(ctx, []d1client.Statement{l.sql.sweep(l.cfg.Retention, l.cfg.SweepBatch, l.now())}, d1client.Idempotent())
	if err != nil {
		return err
	}
	n := r[0].Meta.Changes
	if n > 0 {
		l.tel.add(l.tel.swept, n, attrSweepSource.String("admin"))
	}
	hr.Deleted, hr.Batches, hr.Complete = hr.Deleted+n, hr.Batches+1, n < int64(l.cfg.SweepBatch)
	res.Deleted, res.Batches = res.Deleted+n, res.Batches+1
	if progress != nil {
		progress(SweepProgress{Home: h.id, Deleted: res.Deleted, Batches: res.Batches})
	}
	return nil
}

// countBacklog counts each database's backlog into res.
func (a *Admin) countBacklog(ctx context.Context, hs []*home, res SweepResult) (SweepResult, error) {
	for i, h := range hs {
		r, err := h.db.Exec(ctx, []d1client.Statement{a.backlogStatement()}, d1client.Idempotent())
		var n int64
		if err == nil {
			err = r[0].Rows[0].Scan(&n)
		}
		if err != nil {
			return res, &HomeError{Home: h.id, Err: err}
		}
		res.Homes[i].Backlog = &n
		res.Backlog += n
	}
	return res, nil
}

// backlogStatement counts the rows last updated more than Retention ago.
func (a *Admin) backlogStatement() d1client.Statement {
	return stale(a.l.sql.query(a.l.now()).add("SELECT count(*) FROM "+d1idem.Table+" WHERE "), a.l.cfg.Retention).statement()
}
