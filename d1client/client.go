package d1client

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/d1idem/d1idem/d1client/budget"
	"github.com/d1idem/d1idem/internal/textcache"
)

const (
	// DefaultBaseURL is Cloudflare's API base URL.
	DefaultBaseURL = "https://api.cloudflare.com/client/v4/"
	// APIBaseURLEnv and BaseURLEnv (wrangler's, cloudflare-go's) give the
	// API base URL when Config.BaseURL is empty; they must agree.
	APIBaseURLEnv = "CLOUDFLARE_API_BASE_URL"
	BaseURLEnv    = "CLOUDFLARE_BASE_URL"
	// DefaultAttemptTimeout bounds one HTTP attempt, above D1's 30 s query limit.
	DefaultAttemptTimeout = 45 * time.Second
	maxResponseBytes      = 64 << 20 // read of one response body at most
)

// Config configures a Client. Its String, GoString, Format, LogValue and
// MarshalJSON methods never show the API token or the secret of BridgeURL.
type Config struct {
	// BaseURL of the Cloudflare API or a d1local server; empty means the
	// environment's (APIBaseURLEnv, BaseURLEnv), else DefaultBaseURL.
	BaseURL string
	// BridgeURL, https://:SECRET@HOST (http:// for this machine only), is a
	// d1idem bridge (docs/bridge.md) replacing BaseURL and APIToken; the
	// zero Budget then means none. Empty means $D1IDEM_BRIDGE_URL if BaseURL
	// is empty too.
	BridgeURL string
	APIToken  string // sent as a bearer token
	// AccountID and DatabaseID name the D1 database. Both are required.
	AccountID      string
	DatabaseID     string
	HTTPClient     *http.Client  // if set, carries every request
	Retry          RetryPolicy   // the zero value is DefaultRetryPolicy()
	AttemptTimeout time.Duration // each HTTP attempt's: 10 ms to 10 min; 0: DefaultAttemptTimeout
	// Budget is the API budget (package budget); zero: Cloudflare's 1200
	// calls per 300 s. Account, if set, is one shared by every Client given
	// it (one Cloudflare account), and Budget must then be zero.
	Budget   budget.Budget
	Account  *budget.Account
	Coalesce CoalesceConfig // group commit, for calls made with Coalesce()
	Logger   *slog.Logger   // retry and rate-limit events; nil discards them
	// MeterProvider and TracerProvider receive the client's metrics and
	// spans (docs/observability.md); nil means otel's global providers.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
}

// Client is a D1 REST client, safe for concurrent use. Printing it never
// shows the API token.
type Client struct {
	cfg     Config  // with defaults; APIToken cleared: see token
	token   *string // behind a pointer, so that printing a Client shows an address
	auth    *string // "Bearer <token>", or "" without a token
	http    *http.Client
	rawURL  string
	log     *slog.Logger
	account *budget.Account
	batch   *batcher
	classes *textcache.Cache[sqlClass] // classifySQL by SQL text
	tel     *telemetry
	bridge  bool // cfg came from a bridge URL: see Config.BridgeURL

	stats clientStats
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// New validates cfg and returns a Client. It makes no network call.
func New(cfg Config) (*Client, error) {
	bridge, err := cfg.applyBridge()
	if err != nil {
		return nil, err
	}
	if cfg.BaseURL, err = resolveBaseURL(cfg.BaseURL); err != nil {
		return nil, err
	}
	switch {
	case cfg.AccountID == "":
		return nil, invalidf("account ID is required (CLOUDFLARE_ACCOUNT_ID)")
	case !idPattern.MatchString(cfg.AccountID):
		return nil, invalidf("account ID %q is not a Cloudflare identifier", cfg.AccountID)
	case cfg.DatabaseID == "":
		return nil, invalidf("database ID is required (D1_DATABASE_ID)")
	case !idPattern.MatchString(cfg.DatabaseID):
		return nil, invalidf("database ID %q is not a D1 database UUID", cfg.DatabaseID)
	}
	if err := setting("AttemptTimeout", &cfg.AttemptTimeout, 10*time.Millisecond, 10*time.Minute, DefaultAttemptTimeout); err != nil {
		return nil, err
	}
	if cfg.Retry, err = cfg.Retry.withDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Budget.Validate(); err != nil {
		return nil, invalidf("Config.Budget: %v", err)
	}
	account := cfg.Account
	switch {
	case account == nil:
		account, _ = budget.NewAccount(cfg.Budget) // valid: checked above
	case cfg.Budget != budget.Budget{}:
		return nil, invalidf("Config.Budget and Config.Account are both set: give the Budget to budget.NewAccount")
	}
	if cfg.Coalesce, err = cfg.Coalesce.withDefaults(); err != nil {
		return nil, err
	}
	token, auth := cfg.APIToken, ""
	if token != "" {
		auth = "Bearer " + token
	}
	cfg.APIToken = ""
	c := &Client{
		cfg:     cfg,
		token:   &token,
		auth:    &auth,
		http:    cmp.Or(cfg.HTTPClient, http.DefaultClient),
		rawURL:  cfg.BaseURL + "accounts/" + cfg.AccountID + "/d1/database/" + cfg.DatabaseID + "/raw",
		log:     cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		account: account,
		classes: textcache.New[sqlClass](classCacheEntries, classCacheMaxSQL),
		tel:     newTelemetry(cfg.MeterProvider, cfg.TracerProvider, cfg.DatabaseID),
		bridge:  bridge,
	}
	c.batch = &batcher{pol: newGroupPolicy(cfg.Coalesce), c: c, kick: make(chan struct{}), returns: 1, lane: account.NewLane()}
	observeBudget(c, cfg.MeterProvider)
	return c, nil
}

// resolveBaseURL returns the base URL Config.BaseURL means, with a trailing slash.
func resolveBaseURL(configured string) (string, error) {
	u := configured
	if u == "" {
		wrangler, cf := os.Getenv(APIBaseURLEnv), os.Getenv(BaseURLEnv)
		if wrangler != "" && cf != "" && strings.TrimRight(wrangler, "/") != strings.TrimRight(cf, "/") {
			return "", invalidf("%s (%q) and %s (%q) name different API base URLs: unset one of them, or set Config.BaseURL",
				APIBaseURLEnv, wrangler, BaseURLEnv, cf)
		}
		u = cmp.Or(wrangler, cf, DefaultBaseURL)
	}
	p, err := url.Parse(u)
	switch {
	case err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "":
		return "", invalidf("base URL %q must start with http:// or https:// and name a host", redactURL(u))
	case p.RawQuery != "" || p.ForceQuery || p.Fragment != "":
		return "", invalidf("base URL %s must not have a query or fragment: each call's path is appended to it", redactURL(u))
	}
	if !strings.HasSuffix(u, "/") {
		u += "/"
	}
	return u, nil
}

func invalidf(format string, args ...any) *Error {
	return &Error{kind: kindInvalid, Message: fmt.Sprintf(format, args...)}
}

// setting sets *v, Config's field name, to dflt if 0, or fails outside lo to hi.
func setting[T int | time.Duration](name string, v *T, lo, hi, dflt T) error {
	if *v != 0 && (*v < lo || *v > hi) {
		return invalidf("Config.%s is %v; accepted: 0 (the default, %v) or %v to %v", name, *v, dflt, lo, hi)
	}
	*v = cmp.Or(*v, dflt)
	return nil
}

// ExecOption adjusts one Exec call.
type ExecOption func(*execOptions)

type execOptions struct {
	idempotent    bool
	untilDeadline bool
	coalesce      bool
	class         budget.Class
	operation     string
	owe, pay      *budget.Debt
	sent          *time.Time
	check         *Statement
	checked       func(Result) bool
}

// Idempotent marks the call safe to send again even if an earlier attempt
// reached D1: running it twice has the effect of running it once.
func Idempotent() ExecOption { return func(o *execOptions) { o.idempotent = true } }

// RetryUntilDeadline retries a retryable call until the context's deadline,
// if it has one, instead of RetryPolicy.MaxAttempts times.
func RetryUntilDeadline() ExecOption { return func(o *execOptions) { o.untilDeadline = true } }

// Coalesce lets the call share a D1 batch with concurrent calls (see
// CoalesceConfig): only for statements that cannot fail by design.
func Coalesce() ExecOption { return func(o *execOptions) { o.coalesce = true } }

// Priority marks the call as completing, renewing or releasing what an
// earlier call started: it goes first, and may use the calls kept from other
// work (budget.Budget.Kept).
func Priority() ExecOption { return func(o *execOptions) { o.class = budget.Priority } }

// Owes marks a call whose success obliges its caller to make a Priority
// call later (a claim, later completed): the call is taken only if the
// budget can keep, from then on, the calls d's terms may need (see
// budget.Debt), and admits d when it is. A call refused for want of them
// fails with ErrBudget, unsent. The caller pays d (d.Pay, or a call made
// with Pays) when the obligation ends.
func Owes(d *budget.Debt) ExecOption { return func(o *execOptions) { o.owe = d } }

// Pays marks a call that pays back d, a debt admitted by a call made with
// Owes (a completion, a release): taking it pays d, and it may use the
// calls kept for d.
func Pays(d *budget.Debt) ExecOption { return func(o *execOptions) { o.pay = d } }

// Check gives a coalesced call a check: a read-only statement that cannot
// fail, and ok, which says from its result whether the call's statements
// can commit (a fence they guard, still held). Should a shared call
// carrying them fail with an SQL error, group commit sends its callers'
// checks together in one call: a caller whose check fails is answered that
// error at once, as alone it would be, and the others are sent again
// together. A fenced caller among many thus costs two calls more, however
// many shared the call, instead of two per halving (see CoalesceConfig).
// ok runs on group commit's goroutine, before Exec returns; the statements
// without Coalesce ignore the check.
func Check(stmt Statement, ok func(Result) bool) ExecOption {
	return func(o *execOptions) { o.check, o.checked = &stmt, ok }
}

// SentAt makes Exec set *t to when the first attempt that went out to D1
// was sent (the zero time if none did): nothing the statements do at D1
// happens before it, however long they waited for the budget or for group
// commit. A claim's lease starts no earlier, by D1's clock, than this.
func SentAt(t *time.Time) ExecOption { return func(o *execOptions) { o.sent = t } }

// Operation names the call in metrics and spans (d1idem.d1.operation): a
// small fixed set; the default is "exec".
func Operation(name string) ExecOption { return func(o *execOptions) { o.operation = name } }

// Exec runs the statements as one D1 call, one transaction, and returns one
// Result per statement. A Statement holding more than one SQL statement is
// ErrInvalid. Failures are retried as the package doc says.
func (c *Client) Exec(ctx context.Context, stmts []Statement, opts ...ExecOption) ([]Result, error) {
	var o execOptions
	for _, opt := range opts {
		opt(&o)
	}
	op := c.tel.op(cmp.Or(o.operation, defaultOperation))
	start := time.Now()
	wire, readOnly, e := c.encode(stmts)
	if e != nil {
		c.tel.operation(op, kindInvalid, time.Since(start))
		return nil, e
	}
	safe := readOnly || o.idempotent // may be sent again even if delivered
	cl, d := o.class, callTerms{owe: o.owe, pay: o.pay}
	if o.check != nil && o.checked != nil && o.coalesce {
		w, ro, e := c.encode([]Statement{*o.check})
		if e == nil && !ro {
			e = invalidf("the check is not a read-only statement")
		}
		if e != nil {
			c.tel.operation(op, kindInvalid, time.Since(start))
			return nil, e
		}
		d.check = &groupCheck{wire: w[0], ok: o.checked}
	}
	send := c.batch.submit
	if !o.coalesce {
		send = c.call
	}

	var last *Error // the previous attempt's failure
	if o.sent != nil {
		*o.sent = time.Time{}
	}
	for attempt := 1; ; attempt++ {
		actx, span := c.tel.startAttempt(ctx, op)
		results, shared, sent, err := send(actx, wire, cl, d) // shared: the statements of the call that carried ours
		if o.sent != nil && o.sent.IsZero() {
			*o.sent = sent
		}
		c.tel.endAttempt(span, op, attempt, o.coalesce, len(stmts), shared, err)
		if err == nil {
			c.stats.execs.Add(1)
			c.tel.operation(op, 0, time.Since(start))
			return results, nil
		}
		if err.kind == kindBudget {
			c.tel.sheds.Add(context.Background(), 1, c.tel.shedSets[cl]...)
		}
		if last != nil && !err.Ambiguous && (ctx.Err() != nil || err.notSent && last.Ambiguous) {
			// Never sent: report the previous failure, which may have committed.
			return c.failed(op, start, last)
		}
		err.Statements = redactAll(stmts)
		err.Attempts = attempt
		delay, retry := c.retryDelay(ctx, err, attempt, safe, o.untilDeadline)
		if !retry {
			return c.failed(op, start, err)
		}
		c.stats.retries.Add(1)
		c.tel.retries.Add(context.Background(), 1, op.add[err.kind]...)
		c.log.LogAttrs(ctx, slog.LevelWarn, "d1client: retrying",
			slog.String("kind", err.kind.String()), slog.Int("status", err.StatusCode),
			slog.Int("attempt", attempt), slog.Duration("delay", delay))
		select {
		case <-ctx.Done():
			return c.failed(op, start, err)
		case <-time.After(delay):
		}
		last = err
	}
}

// failed counts a failed Exec call, started at start, and returns its error.
func (c *Client) failed(op *opTelemetry, start time.Time, e *Error) ([]Result, error) {
	c.stats.failures.Add(1)
	c.tel.operation(op, e.kind, time.Since(start))
	return nil, e
}

// Query runs one statement and returns its result.
func (c *Client) Query(ctx context.Context, sql string, params ...any) (*Result, error) {
	res, err := c.Exec(ctx, []Statement{{SQL: sql, Params: params}})
	if err != nil {
		return nil, err
	}
	return &res[0], nil
}

// encode validates and encodes the statements, and reports whether all are proven read-only.
func (c *Client) encode(stmts []Statement) ([]wireStatement, bool, *Error) {
	if len(stmts) == 0 {
		return nil, false, invalidf("no statements")
	}
	wire := make([]wireStatement, len(stmts))
	readOnly := true
	for i, s := range stmts {
		w, err := s.encode(i + 1)
		if err == nil {
			cl := c.classes.Get(s.SQL, classifySQL)
			err = cl.check(i + 1)
			readOnly = readOnly && cl.readOnly
		}
		if err != nil {
			e := invalidf("%v", err)
			e.Statements = redactAll(stmts)
			return nil, false, e
		}
		wire[i] = w
	}
	return wire, readOnly, nil
}

func redactAll(stmts []Statement) []string {
	out := make([]string, len(stmts))
	for i, s := range stmts {
		out[i] = s.redacted()
	}
	return out
}

// callTerms are what an Exec call asks of the D1 call that carries it: the
// debt it would admit and the one it pays (see Owes), and its check.
type callTerms struct {
	owe, pay *budget.Debt
	check    *groupCheck
}

// groupCheck is a coalesced call's check (see Check), encoded.
type groupCheck struct {
	wire wireStatement
	ok   func(Result) bool
}

// call sends the statements alone, on a call of class cl from the budget.
func (c *Client) call(ctx context.Context, wire []wireStatement, cl budget.Class, d callTerms) ([]Result, int, time.Time, *Error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, time.Time{}, notSent(err, "")
	}
	call := budget.Call{Class: cl, Lane: c.batch.lane}
	if d.pay != nil {
		call.Pays, call.PayShare = []*budget.Debt{d.pay}, 1 // a call of its own
	}
	if d.owe != nil && !d.owe.Admitted() {
		call.Owes = []*budget.Debt{d.owe}
	}
	if e := c.acquire(ctx, &call); e != nil {
		return nil, 0, time.Time{}, e
	}
	body, sent := encodeBody(wire), time.Now()
	results, e := c.send(ctx, body, len(wire), false)
	return results, 0, sent, e
}

// Stats counts what a Client has done since it was created.
type Stats struct {
	Calls      int64 // HTTP calls sent to D1 (every attempt counts)
	Statements int64 // statements carried by those calls
	Execs      int64 // Exec calls that succeeded
	Retries    int64 // attempts repeated after a failure
	Failures   int64 // Exec calls that returned an error
}

type clientStats struct{ calls, statements, execs, retries, failures atomic.Int64 }

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Calls: c.stats.calls.Load(), Statements: c.stats.statements.Load(),
		Execs: c.stats.execs.Load(), Retries: c.stats.retries.Load(), Failures: c.stats.failures.Load(),
	}
}

// Account returns the Account whose budget the client spends.
func (c *Client) Account() *budget.Account { return c.account }

// AccountID returns the configured account ID.
func (c *Client) AccountID() string { return c.cfg.AccountID }

// DatabaseID returns the configured database ID.
func (c *Client) DatabaseID() string { return c.cfg.DatabaseID }

// BaseURL returns the API base URL the client sends to, with a trailing slash.
func (c *Client) BaseURL() string { return c.cfg.BaseURL }

// Executor runs statements on one D1 database as *Client.Exec does: one
// call, one transaction, one Result per statement. It honours the options it
// knows and ignores the others; its errors match this package's sentinels.
type Executor interface {
	Exec(ctx context.Context, stmts []Statement, opts ...ExecOption) ([]Result, error)
}

var _ Executor = (*Client)(nil)
