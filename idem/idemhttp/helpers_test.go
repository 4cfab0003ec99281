package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

var bg = context.Background()

// newLedger returns a ledger on db; its logs are discarded unless cfg has a
// Logger.
func newLedger(t testing.TB, db d1client.Executor, cfg idem.Config) *idem.Ledger {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := idem.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func begin(t testing.TB, l *idem.Ledger, principal, key, fp string) idem.Decision {
	t.Helper()
	d, err := l.Begin(bg, principal, key, fp)
	if err != nil {
		t.Fatalf("Begin(%s, %s): %v", principal, key, err)
	}
	return d
}

// lockedWriter is a log destination that handlers on many goroutines
// share.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Every option of the middleware is validated, naming the field, with an
// *idem.ConfigError.
func TestOptionsValidation(t *testing.T) {
	l := newLedger(t, d1test.Local(t).NewClient(t), idem.Config{})
	p := func(*http.Request) (string, error) { return "p", nil }
	for _, tc := range []struct {
		opts idemhttp.Options
		want string
	}{
		{idemhttp.Options{}, "Options.Principal is required"},
		{idemhttp.Options{Principal: p, ReuseStatus: 400}, "Options.ReuseStatus 400 is out of range: use 409 (the spec) or 422"},
		{idemhttp.Options{Principal: p, ReuseStatus: 418}, "Options.ReuseStatus 418"},
		{idemhttp.Options{Principal: p, MaxBodyBytes: -1}, "Options.MaxBodyBytes -1 is out of range: use 1 to 1073741824 bytes"},
		{idemhttp.Options{Principal: p, MaxBodyBytes: 2 << 30}, "Options.MaxBodyBytes"},
		{idemhttp.Options{Principal: p, Timeout: -time.Second}, "Options.Timeout -1s is out of range: use 1ms to 10m0s"},
		{idemhttp.Options{Principal: p, Timeout: time.Hour}, "Options.Timeout 1h0m0s"},
		{idemhttp.Options{Principal: p, Methods: []string{"POST", "BAD METHOD"}}, `Options.Methods[1] "BAD METHOD"`},
		{idemhttp.Options{Principal: p, Methods: []string{""}}, `Options.Methods[0] ""`},
	} {
		_, err := idemhttp.New(l, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.opts, err, tc.want)
		}
		var ce *idem.ConfigError
		if isConfig := errors.As(err, &ce); isConfig != (tc.opts.Principal != nil) || isConfig && !strings.HasPrefix(tc.want, ce.Field) {
			t.Errorf("%+v: %v is not a ConfigError naming the field", tc.opts, err)
		}
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), tc.want) {
					t.Errorf("Must(%+v) panicked with %v", tc.opts, v)
				}
			}()
			idemhttp.Must(l, tc.opts)
		}()
	}
	if _, err := idemhttp.New(nil, idemhttp.Options{Principal: p}); err == nil {
		t.Error("nil ledger accepted")
	}
	for _, status := range []int{0, 409, 422} {
		if _, err := idemhttp.New(l, idemhttp.Options{Principal: p, ReuseStatus: status}); err != nil {
			t.Errorf("ReuseStatus %d: %v", status, err)
		}
	}
}
