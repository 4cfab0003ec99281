package idem_test

import (
	"bytes"
	"context"
	"errors"

	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Concurrent deliveries of one job run its function once: the others are
// told it is in progress (or, once it is done, get its stored result), and
// every later delivery gets the same result without running it.
func TestDoConcurrentDeliveriesRunOnce(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		l := newLedger(t, b.NewClientSchema(t), idem.Config{})
		job := idem.Job{Principal: "orders-queue", Key: "msg-1", Payload: []byte(`{"order":1}`)}
		var runs atomic.Int64
		release := make(chan struct{})
		fn := func(ctx context.Context, run *idem.Run) ([]byte, error) {
			runs.Add(1)
			<-release
			return []byte("shipped"), nil
		}
		const deliveries = 16
		var wg sync.WaitGroup
		var inProgress, ran atomic.Int64
		for range deliveries {
			wg.Go(func() {
				res, err := l.Do(bg, job, fn)
				var ip *idem.InProgressError
				switch {
				case errors.As(err, &ip) && errors.Is(err, idem.ErrInProgress) && ip.RetryAfter > 0:
					inProgress.Add(1)
				case err == nil && string(res.Value) == "shipped":
					ran.Add(1)
				default:
					t.Errorf("delivery: %+v %v", res, err)
				}
			})
		}
		for inProgress.Load() < deliveries-1 && !t.Failed() {
			time.Sleep(time.Millisecond) // until every other delivery has been turned away
		}
		close(release)
		wg.Wait()
		if runs.Load() != 1 || ran.Load() != 1 || inProgress.Load() != deliveries-1 {
			t.Fatalf("runs %d, executed %d, in progress %d", runs.Load(), ran.Load(), inProgress.Load())
		}
		res, err := l.Do(bg, job, fn)
		if err != nil || !res.Replayed || string(res.Value) != "shipped" || runs.Load() != 1 {
			t.Fatalf("a later delivery: %+v %v (runs %d)", res, err, runs.Load())
		}
	})
}

// A key reused with another payload is refused, neither run nor answered.
func TestDoKeyReusedWithAnotherPayload(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	ok := func(context.Context, *idem.Run) ([]byte, error) { return []byte("a"), nil }
	if _, err := l.Do(bg, idem.Job{Principal: "p", Key: "k", Payload: []byte("one")}, ok); err != nil {
		t.Fatal(err)
	}
	res, err := l.Do(bg, idem.Job{Principal: "p", Key: "k", Payload: []byte("two")}, func(context.Context, *idem.Run) ([]byte, error) {
		t.Error("ran for another payload")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrKeyReused) || res.Value != nil {
		t.Fatalf("%+v %v, want ErrKeyReused", res, err)
	}
	// Another principal's same key and payload is another job.
	if res, err := l.Do(bg, idem.Job{Principal: "q", Key: "k", Payload: []byte("two")}, ok); err != nil || res.Replayed {
		t.Fatalf("another principal: %+v %v", res, err)
	}
}

// A function's error is not stored: the key is released, and the next
// delivery runs the function again. A final error is stored, and returned
// by every later delivery without running it.
func TestDoErrorsReleaseUnlessFinal(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	job := idem.Job{Principal: "p", Key: "retry-me"}
	var runs atomic.Int64
	transient := errors.New("the payment provider timed out")
	fn := func(context.Context, *idem.Run) ([]byte, error) {
		if runs.Add(1) == 1 {
			return nil, transient
		}
		return []byte("paid"), nil
	}
	if _, err := l.Do(bg, job, fn); !errors.Is(err, transient) {
		t.Fatalf("first delivery: %v", err)
	}
	if res, err := l.Do(bg, job, fn); err != nil || string(res.Value) != "paid" || res.Replayed || res.Generation != 3 {
		t.Fatalf("second delivery: %+v %v, want a run at generation 3 (the release moved it on one)", res, err)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs", runs.Load())
	}

	final := idem.Job{Principal: "p", Key: "card-declined"}
	declined := errors.New("card declined")
	for i := range 3 {
		res, err := l.Do(bg, final, func(context.Context, *idem.Run) ([]byte, error) {
			if i > 0 {
				t.Error("a final error's job ran again")
			}
			return nil, idem.Final(declined)
		})
		var fe *idem.FinalError
		if !errors.As(err, &fe) || err.Error() != "card declined" || res.Replayed != (i > 0) {
			t.Fatalf("delivery %d: %+v %v", i, res, err)
		}
		if i == 0 && !errors.Is(err, declined) {
			t.Errorf("the first run's error is not the function's: %v", err)
		}
	}
}

// A panicking function releases the key (it does not stay pending for the
// TTL) and the panic goes on; the next delivery runs.
func TestDoPanicReleasesKey(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	job := idem.Job{Principal: "p", Key: "boom"}
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the function's panic", v)
			}
		}()
		l.Do(bg, job, func(context.Context, *idem.Run) ([]byte, error) { panic("boom") })
	}()
	res, err := l.Do(bg, job, func(context.Context, *idem.Run) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || string(res.Value) != "ok" || res.Generation != 3 {
		t.Fatalf("after the panic: %+v %v, want a run at once (generation 3: the release moved it on one)", res, err)
	}
}

// A lost lease cancels the function's context with ErrLeaseLost; its
// error says so, and the key is the new owner's.
func TestDoLostLeaseCancelsFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, db := fakeTimeLedger(t, idem.Config{TTL: 3 * time.Second}, nil)
		job := idem.Job{Principal: "p", Key: "stolen"}
		_, err := l.Do(bg, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			// An operator releases the key meanwhile (as a takeover would).
			if _, err := db.Query(bg, "UPDATE idempotency_keys SET generation = generation + 1 WHERE key = 'stolen'"); err != nil {
				t.Error(err)
			}
			<-ctx.Done()
			if cause := context.Cause(ctx); !errors.Is(cause, idem.ErrLeaseLost) {
				t.Errorf("cause %v", cause)
			}
			return nil, ctx.Err()
		})
		if !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Do: %v, want the function's error and ErrLeaseLost", err)
		}
	})
}

// A run that finishes after a takeover superseded it is fenced out: its
// result and its statements are not stored, and delivering the job again
// answers with the new owner's.
func TestDoFencedOut(t *testing.T) {
	b := d1test.Local(t)
	db := b.NewClientSchema(t)
	exec(t, db, "CREATE TABLE shipments (id TEXT PRIMARY KEY, gen INTEGER)")
	clk := newClock()
	l := newLedger(t, db, idem.Config{Clock: clk.Now, TTL: time.Second, Heartbeat: -1})
	job := idem.Job{Principal: "p", Key: "slow"}
	_, err := l.Do(bg, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
		clk.Advance(2 * time.Second) // presumed dead: another delivery takes over and finishes
		res, err := l.Do(bg, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			return []byte("second"), run.Add(d1client.Statement{SQL: "INSERT INTO shipments VALUES ('s1', ?)", Params: []any{run.Generation()}})
		})
		if err != nil || string(res.Value) != "second" || res.Generation != 2 {
			t.Errorf("the takeover: %+v %v", res, err)
		}
		return []byte("first"), run.Add(d1client.Statement{SQL: "INSERT INTO shipments VALUES ('s1', ?) ON CONFLICT DO NOTHING", Params: []any{run.Generation()}})
	})
	if !errors.Is(err, idem.ErrFencedOut) {
		t.Fatalf("the superseded run: %v, want ErrFencedOut", err)
	}
	if res, err := l.Do(bg, job, nil); err != nil || string(res.Value) != "second" || !res.Replayed {
		t.Fatalf("delivered again: %+v %v", res, err)
	}
	if got := queryInt(t, db, "SELECT gen FROM shipments"); got != 2 {
		t.Errorf("the shipment was written at generation %d, want 2 only", got)
	}
}

// A Run's statements commit with the result, in one transaction: once per
// key, however often the job is delivered.
func TestDoStatementsCommitWithResult(t *testing.T) {
	d1test.ForEach(t, func(t *testing.T, b *d1test.Backend) {
		db := b.NewClientSchema(t)
		exec(t, db, "CREATE TABLE emails (id TEXT PRIMARY KEY, body TEXT)")
		l := newLedger(t, db, idem.Config{})
		var late *idem.Run
		for range 3 {
			_, err := l.Do(bg, idem.Job{Principal: "mailer", Key: "welcome/u1"}, func(ctx context.Context, run *idem.Run) ([]byte, error) {
				late = run
				return []byte("sent"), run.Add(d1client.Statement{SQL: "INSERT INTO emails VALUES ('u1', 'welcome')"})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := queryInt(t, db, "SELECT count(*) FROM emails"); n != 1 {
			t.Errorf("%d emails, want 1", n)
		}
		if err := late.Add(d1client.Statement{SQL: "SELECT 1"}); !errors.Is(err, idem.ErrRunClosed) {
			t.Errorf("Add after the function returned: %v", err)
		}
		// A statement that fails commits nothing and releases the key.
		_, err := l.Do(bg, idem.Job{Principal: "mailer", Key: "welcome/u2"}, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			return []byte("sent"), run.Add(d1client.Statement{SQL: "INSERT INTO emails VALUES ('u1', 'duplicate')"})
		})
		if !errors.Is(err, idem.ErrTxNotCommitted) {
			t.Fatalf("a failing statement: %v", err)
		}
		res, err := l.Do(bg, idem.Job{Principal: "mailer", Key: "welcome/u2"}, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			return []byte("sent"), run.Add(d1client.Statement{SQL: "INSERT INTO emails VALUES ('u2', 'welcome')"})
		})
		if err != nil || res.Replayed {
			t.Fatalf("delivered again after the failure: %+v %v", res, err)
		}
	})
}

// Keys that are not valid Idempotency-Keys (a message ID too long, or not
// printable ASCII) are hashed; an empty key is refused; results that are
// not UTF-8 round-trip; DoJSON stores and decodes a value.
func TestDoKeysAndResults(t *testing.T) {
	db := d1test.Local(t).NewClientSchema(t)
	l := newLedger(t, db, idem.Config{})
	binary := []byte{0xff, 0x00, 0xfe}
	for _, key := range []string{strings.Repeat("m", 300), "message id with ümlaut", "tab\tkey"} {
		res, err := l.Do(bg, idem.Job{Principal: "p", Key: key}, func(context.Context, *idem.Run) ([]byte, error) { return binary, nil })
		if err != nil || !bytes.Equal(res.Value, binary) {
			t.Fatalf("%q: %+v %v", key, res, err)
		}
		res, err = l.Do(bg, idem.Job{Principal: "p", Key: key}, nil)
		if err != nil || !res.Replayed || !bytes.Equal(res.Value, binary) {
			t.Fatalf("%q replayed: %+v %v", key, res, err)
		}
	}
	if n := queryInt(t, db, "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'sha256:%' AND length(key) = 71"); n != 3 {
		t.Errorf("%d hashed keys, want 3", n)
	}
	if _, err := l.Do(bg, idem.Job{Principal: "p"}, nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("an empty key: %v", err)
	}

	type receipt struct {
		ID    string `json:"id"`
		Cents int64  `json:"cents"`
	}
	var runs int
	for i := range 2 {
		v, res, err := idem.DoJSON(bg, l, idem.Job{Principal: "p", Key: "charge-7", Payload: []byte("500")}, func(context.Context, *idem.Run) (receipt, error) {
			runs++
			return receipt{ID: "ch_7", Cents: 500}, nil
		})
		if err != nil || v != (receipt{ID: "ch_7", Cents: 500}) || res.Replayed != (i == 1) {
			t.Fatalf("DoJSON %d: %+v %+v %v", i, v, res, err)
		}
	}
	if runs != 1 {
		t.Errorf("DoJSON ran %d times", runs)
	}
}

// The result is stored even when the caller's context ends as the
// function returns (a message's deadline, a shutdown).
func TestDoStoresAfterCancel(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClientSchema(t), idem.Config{})
	ctx, cancel := context.WithCancel(bg)
	res, err := l.Do(ctx, idem.Job{Principal: "p", Key: "k"}, func(context.Context, *idem.Run) ([]byte, error) {
		cancel()
		return []byte("done"), nil
	})
	if err != nil || string(res.Value) != "done" {
		t.Fatalf("%+v %v", res, err)
	}
	if res, err := l.Do(bg, idem.Job{Principal: "p", Key: "k"}, nil); err != nil || !res.Replayed {
		t.Fatalf("replay: %+v %v", res, err)
	}
}

func exec(t *testing.T, db *d1client.Client, sql string) {
	t.Helper()
	if _, err := db.Query(bg, sql); err != nil {
		t.Fatal(err)
	}
}

func queryInt(t *testing.T, db *d1client.Client, sql string) int64 {
	t.Helper()
	res, err := db.Query(bg, sql)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if len(res.Rows) != 1 || res.Rows[0].Scan(&n) != nil {
		t.Fatalf("%s: %v", sql, res.Rows)
	}
	return n
}
