package cli

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

// previewBytes is how much of a stored body keys get shows.
const previewBytes = 200

func keysCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "keys",
		Usage: "inspect and release idempotency keys",
		Description: `Shows the ledger's rows and releases stuck ones. Start with 'd1idem keys stuck':
it lists the pending keys whose owner has gone quiet for longer than the TTL.

   d1idem keys stuck
   d1idem keys get --principal acct_42 --key order-7
   d1idem keys release --principal acct_42 --key order-7 --generation 1`,
		Subcommands: []*cli.Command{
			keysGetCommand(o),
			keysListCommand(o),
			keysStuckCommand(o),
			keysReleaseCommand(o),
		},
	}
}

func principalFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: "principal", Usage: usage}
}

func keyFlag() cli.Flag {
	return &cli.StringFlag{Name: "key", Usage: "the Idempotency-Key `KEY`, as the client sent it"}
}

func ttlFlag() cli.Flag {
	return &cli.DurationFlag{Name: "ttl", Value: idem.DefaultTTL, Usage: "the pending `TTL` the application uses: a pending key without an update for longer is stuck"}
}

func limitFlag() cli.Flag {
	return &cli.IntFlag{Name: "limit", Value: idem.DefaultListLimit, Usage: fmt.Sprintf("show at most `N` rows (1 to %d)", idem.MaxListLimit)}
}

// Flag readers that turn bad values into usage errors.

func requiredString(c *cli.Context, name string) (string, error) {
	v := c.String(name)
	if v == "" {
		return "", usagef("--%s is required; see 'd1idem %s --help'", name, commandPath(c))
	}
	return v, nil
}

func principalAndKey(c *cli.Context) (string, string, error) {
	principal, err := requiredString(c, "principal")
	if err != nil {
		return "", "", err
	}
	key, err := requiredString(c, "key")
	if err != nil {
		return "", "", err
	}
	if !idem.ValidKey(key) {
		return "", "", usagef("--key %s is not an Idempotency-Key: keys are 1 to 255 printable ASCII characters", strconv.Quote(key))
	}
	return principal, key, nil
}

func positiveDuration(c *cli.Context, name string) (time.Duration, error) {
	d := c.Duration(name)
	if d <= 0 {
		return 0, usagef("--%s %s must be positive", name, d)
	}
	return d, nil
}

func listLimit(c *cli.Context) (int, error) {
	n := c.Int("limit")
	if n < 1 || n > idem.MaxListLimit {
		return 0, usagef("--limit %d is out of range: use 1 to %d", n, idem.MaxListLimit)
	}
	return n, nil
}

func noArgs(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("%s takes no arguments (got %q); values go in flags, see 'd1idem %s --help'", commandPath(c), c.Args().First(), commandPath(c))
	}
	return nil
}

// withConn opens the connection, runs fn, and closes it.
func withConn(c *cli.Context, o *options, fn func(*conn) error, mods ...func(*d1client.Config)) error {
	cn, err := openConn(c, o, mods...)
	if err != nil {
		return err
	}
	defer cn.close()
	return fn(cn)
}

// ---- keys get ----

func keysGetCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "get",
		Usage: "show one key: status, generation, ages, replay headers, body preview",
		Description: `Shows one ledger row: its status and generation (the fencing token), when it was
created and last updated (ages, and UTC times), and what a retry would be
answered with: the response status, the replay headers and the first 200 bytes
of the stored body. It ends with what happens to the next retry, and how to
release the key if it is stuck. Exits 1 if there is no such key.

   d1idem keys get --principal acct_42 --key order-7
   d1idem keys get --principal acct_42 --key order-7 --json`,
		Flags: append([]cli.Flag{
			principalFlag("the `PRINCIPAL` the key belongs to (the server-derived account or user ID)"),
			keyFlag(),
			ttlFlag(),
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			principal, key, err := principalAndKey(c)
			if err != nil {
				return err
			}
			ttl, err := positiveDuration(c, "ttl")
			if err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error {
				return keysGet(c, o, cn, principal, key, ttl)
			})
		},
	}
}

func keysGet(c *cli.Context, o *options, cn *conn, principal, key string, ttl time.Duration) error {
	a, err := keysAdmin(o, cn, ttl)
	if err != nil {
		return err
	}
	k, err := a.Get(c.Context, principal, key)
	if errors.Is(err, idem.ErrKeyNotFound) {
		return fmt.Errorf("no key %s for principal %s on %s (it was never claimed, or was swept)",
			strconv.Quote(key), strconv.Quote(principal), cn.where)
	}
	if err != nil {
		return ledgerErr("keys get", err)
	}
	headers, headersErr := k.StoredHeaders()
	var bodyPreview *string
	var bodyBytes *int
	more := 0
	if k.ResponseBody != nil {
		p, m := preview(*k.ResponseBody, previewBytes)
		n := len(*k.ResponseBody)
		bodyPreview, bodyBytes, more = &p, &n, m
	}

	if c.Bool(flagJSON) {
		out := keyDetailJSON{
			keySummaryJSON: summaryJSON(&k), Fingerprint: k.Fingerprint,
			ResponseHeaders: headers, ResponseHeadersRaw: k.ResponseHeaders,
			ResponseBodyBytes: bodyBytes, ResponseBodyPreview: bodyPreview, TTLMS: ttl.Milliseconds(),
		}
		return printJSON(c.App.Writer, out)
	}

	w := c.App.Writer
	dash := "-"
	respStatus, headerText, bodyText := dash, dash, dash
	if k.ResponseStatus != nil {
		respStatus = strconv.FormatInt(*k.ResponseStatus, 10)
	}
	switch {
	case headersErr != nil:
		headerText = fmt.Sprintf("%s (not a JSON object of strings: %v)", strconv.Quote(*k.ResponseHeaders), headersErr)
	case k.ResponseHeaders != nil && len(headers) == 0:
		headerText = "(none)"
	case len(headers) > 0:
		names := make([]string, 0, len(headers))
		for n := range headers {
			names = append(names, n)
		}
		sort.Strings(names)
		var lines []string
		for _, n := range names {
			lines = append(lines, display(n)+": "+display(headers[n]))
		}
		headerText = strings.Join(lines, "\n")
	}
	if bodyPreview != nil {
		bodyText = fmt.Sprintf("%s, %s", plural(int64(*bodyBytes), "byte", "bytes"), strconv.Quote(*bodyPreview))
		if more > 0 {
			bodyText += fmt.Sprintf(" ... (%d more bytes)", more)
		}
	} else if k.Status == idem.StatusCompleted {
		bodyText = "NULL (no body stored: an oversized response is stored as status 500 with no body)"
	}
	if err := printFields(w, [][2]string{
		{"principal", display(k.Principal)},
		{"key", display(k.Key)},
		{"status", statusText(&k, ttl)},
		{"generation", strconv.FormatInt(k.Generation, 10)},
		{"created", fmt.Sprintf("%s  (%s)", formatAge(k.Age()), formatTime(k.CreatedAt))},
		{"updated", fmt.Sprintf("%s  (%s)", formatAge(k.SinceUpdate()), formatTime(k.UpdatedAt))},
		{"fingerprint", display(k.Fingerprint)},
		{"response status", respStatus},
		{"replay headers", headerText},
		{"response body", bodyText},
	}); err != nil {
		return err
	}
	fmt.Fprintln(w)
	release := releaseCommandLine(c, k.Principal, k.Key, k.Generation)
	switch {
	case k.Stuck:
		fmt.Fprintf(w, "Its owner is presumed dead. The next retry of the same request takes the key over\n(generation %d) and executes it. To let it retry now, before the TTL has passed:\n  %s\n",
			k.Generation+1, release)
	case k.Status == idem.StatusPending:
		fmt.Fprintf(w, "Its owner is presumably still running (a live owner renews the row every TTL/3).\nRetries get 409 %s until it completes, or until %s without an update.\n",
			idem.CodeKeyInProgress, formatDuration(ttl))
	case k.Status == idem.StatusCompleted:
		fmt.Fprintf(w, "Retries with this key replay the stored response, without executing, until the sweep\ndeletes the row (%s after its last update with the default retention).\n",
			formatDuration(idem.DefaultRetention))
	}
	return nil
}

func releaseCommandLine(c *cli.Context, principal, key string, generation int64) string {
	return fmt.Sprintf("d1idem keys release --principal %s --key %s --generation %d%s",
		shellQuote(principal), shellQuote(key), generation, connHint(c))
}

// ---- keys list ----

func keysListCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "list keys, oldest update first, filtered and paginated",
		Description: `Lists ledger rows ordered by their last update, then principal and key. Filters
combine. Pages are keyset-paginated: when more rows match, the last line is
"next cursor: TOKEN"; pass it back with --cursor (and the same filters) for the
next page. Pagination is stable while rows are added, updated or deleted.

   d1idem keys list --status pending
   d1idem keys list --principal acct_42 --older-than 1h --limit 100
   d1idem keys list --status completed --cursor v1.WzE3N...`,
		Flags: append([]cli.Flag{
			principalFlag("only keys of this `PRINCIPAL`"),
			&cli.StringFlag{Name: "status", Usage: "only keys with this `STATUS`: pending or completed"},
			&cli.DurationFlag{Name: "older-than", Usage: "only keys whose last update is older than `DURATION` (e.g. 10m, 24h)", DefaultText: "any age"},
			limitFlag(),
			ttlFlag(),
			&cli.StringFlag{Name: "cursor", Usage: "continue after the page that printed this `TOKEN` as its next cursor"},
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			var status idem.Status
			if s := c.String("status"); s != "" {
				var err error
				if status, err = idem.ParseStatus(s); err != nil {
					return usagef("--status %s is not a status: use %s or %s", strconv.Quote(s), idem.StatusPending, idem.StatusCompleted)
				}
			}
			if c.IsSet("older-than") {
				if _, err := positiveDuration(c, "older-than"); err != nil {
					return err
				}
			}
			limit, err := listLimit(c)
			if err != nil {
				return err
			}
			ttl, err := positiveDuration(c, "ttl")
			if err != nil {
				return err
			}
			opts := idem.ListOptions{Principal: c.String("principal"), Status: status, OlderThan: c.Duration("older-than"),
				Limit: limit, Cursor: c.String("cursor")}
			return withConn(c, o, func(cn *conn) error {
				return keysList(c, o, cn, ttl, opts)
			})
		},
	}
}

var errBadCursor = errors.New("--cursor is not a cursor this command printed (a \"next cursor\" token of 'd1idem keys list'); copy it whole, or start without --cursor")

func keysList(c *cli.Context, o *options, cn *conn, ttl time.Duration, opts idem.ListOptions) error {
	a, err := keysAdmin(o, cn, ttl)
	if err != nil {
		return err
	}
	page, err := a.List(c.Context, opts)
	if errors.Is(err, idem.ErrBadCursor) {
		return usageError{errBadCursor}
	}
	if err != nil {
		return ledgerErr("keys list", err)
	}
	var next *string
	if page.NextCursor != "" {
		next = &page.NextCursor
	}
	if c.Bool(flagJSON) {
		out := struct {
			Keys       []keySummaryJSON `json:"keys"`
			NextCursor *string          `json:"next_cursor"`
		}{Keys: summariesJSON(page.Keys), NextCursor: next}
		return printJSON(c.App.Writer, out)
	}
	w := c.App.Writer
	if len(page.Keys) == 0 {
		if opts.Cursor != "" {
			fmt.Fprintln(w, "No more keys after the cursor.")
		} else {
			fmt.Fprintln(w, "No keys match.")
		}
		return nil
	}
	table := make([][]string, 0, len(page.Keys))
	for i := range page.Keys {
		k := &page.Keys[i]
		resp := "-"
		if k.ResponseStatus != nil {
			resp = strconv.FormatInt(*k.ResponseStatus, 10)
		}
		status := display(string(k.Status))
		if k.Stuck {
			status += " (stuck)"
		}
		table = append(table, []string{display(k.Principal), display(k.Key), status, strconv.FormatInt(k.Generation, 10), resp,
			formatAge(k.SinceUpdate()), formatTime(k.UpdatedAt), formatAge(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "STATUS", "GEN", "RESPONSE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	if next != nil {
		fmt.Fprintf(w, "next cursor: %s\n", *next)
	}
	return nil
}

// ---- keys stuck ----

func keysStuckCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "stuck",
		Usage: "list pending keys older than the TTL, oldest first: the first thing to look at",
		Description: `Lists the pending keys that have had no update for longer than the TTL, oldest
first, with how long each has been stuck and its generation. Such a key's owner
is presumed dead (a live owner renews its row every TTL/3): the next retry of the
same request takes it over by itself. The last line shows how to release one, so
that the client may retry now.

   d1idem keys stuck
   d1idem keys stuck --ttl 2m --json`,
		Flags: append([]cli.Flag{ttlFlag(), limitFlag(), jsonFlag()}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			ttl, err := positiveDuration(c, "ttl")
			if err != nil {
				return err
			}
			limit, err := listLimit(c)
			if err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error { return keysStuck(c, o, cn, ttl, limit) })
		},
	}
}

func keysStuck(c *cli.Context, o *options, cn *conn, ttl time.Duration, limit int) error {
	a, err := keysAdmin(o, cn, ttl)
	if err != nil {
		return err
	}
	stuck, err := a.Stuck(c.Context, limit)
	if err != nil {
		return ledgerErr("keys stuck", err)
	}
	rows, total := stuck.Keys, stuck.Total
	if c.Bool(flagJSON) {
		out := struct {
			TTLMS int64            `json:"ttl_ms"`
			Total int64            `json:"total"`
			Keys  []keySummaryJSON `json:"keys"`
		}{TTLMS: ttl.Milliseconds(), Total: total, Keys: summariesJSON(rows)}
		return printJSON(c.App.Writer, out)
	}
	w := c.App.Writer
	if len(rows) == 0 {
		fmt.Fprintf(w, "No stuck keys: no pending key has gone without an update for longer than the %s TTL.\n", formatDuration(ttl))
		return nil
	}
	table := make([][]string, 0, len(rows))
	for i := range rows {
		k := &rows[i]
		table = append(table, []string{display(k.Principal), display(k.Key), strconv.FormatInt(k.Generation, 10),
			formatDuration(k.SinceUpdate()), formatTime(k.UpdatedAt), formatAge(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "GEN", "STUCK FOR", "LAST UPDATE (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	fmt.Fprintln(w)
	shown := ""
	if total > int64(len(rows)) {
		shown = fmt.Sprintf(" (showing the %d oldest; raise --limit for more)", len(rows))
	}
	fmt.Fprintf(w, "%s pending for longer than the %s TTL, oldest first%s.\n", plural(total, "key", "keys"), formatDuration(ttl), shown)
	fmt.Fprintln(w, "A retry of the same request takes a stuck key over by itself, at the next generation.")
	fmt.Fprintln(w, "To let the client retry now, release the key (fenced by its generation):")
	fmt.Fprintf(w, "  %s\n", releaseCommandLine(c, rows[0].Principal, rows[0].Key, rows[0].Generation))
	return nil
}

// ---- keys release ----

func keysReleaseCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:  "release",
		Usage: "release a stuck pending key, fenced by its generation, so the client may retry now",
		Description: `Releases one row, only at the generation given, in one fenced statement, with
the ledger's one release rule (the one the application applies when a handler
panics or streams): the row's generation moves one past the old owner's, and
its last update is set one millisecond further back than the TTL, so the
client's next request with the key takes it over at once (the same request, by
its fingerprint) and executes. The row is never deleted: a fresh claim would
start again at generation 1, which could be an old owner's own generation; the
sweep removes it after the retention.

If another owner has taken the key over (a newer generation) or completed it in
the meantime, nothing changes and the command says what the row holds now.

The old owner, if it is still running, may still perform its mutation; its
completion is fenced by its generation and will not be stored. An owner using
the idem package learns at its next heartbeat that it lost its lease.

Only the same request (by its fingerprint) takes a released key over; a client
that changed its request gets 409 idempotency_key_reused, as the spec says (a new
operation takes a new key).

A pending row updated within the TTL probably has a live owner: it is refused
without --force. A completed row is refused without --force; with --force its
stored response is forgotten (the row is released like a pending one), and the
next retry executes the request again instead of replaying.

   d1idem keys release --principal acct_42 --key order-7 --generation 1`,
		Flags: append([]cli.Flag{
			principalFlag("the `PRINCIPAL` the key belongs to"),
			keyFlag(),
			&cli.Int64Flag{Name: "generation", Usage: "the `GENERATION` to release, as 'keys get' or 'keys stuck' shows it (required: the fence)", DefaultText: "none, required"},
			&cli.BoolFlag{Name: "force", Usage: "also release a pending row updated within the TTL, or a completed row (forgetting its response)", DisableDefaultText: true},
			ttlFlag(),
			jsonFlag(),
		}, connFlags()...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			principal, key, err := principalAndKey(c)
			if err != nil {
				return err
			}
			if !c.IsSet("generation") {
				return usagef("--generation is required: it fences the release to the row you looked at (see 'd1idem keys get')")
			}
			gen := c.Int64("generation")
			if gen < 1 {
				return usagef("--generation %d must be 1 or more", gen)
			}
			ttl, err := positiveDuration(c, "ttl")
			if err != nil {
				return err
			}
			return withConn(c, o, func(cn *conn) error {
				return keysRelease(c, o, cn, principal, key, gen, ttl, c.Bool("force"))
			})
		},
	}
}

// releaseJSON is keys release --json.
type releaseJSON struct {
	Released   bool   `json:"released"`
	Principal  string `json:"principal"`
	Key        string `json:"key"`
	Generation int64  `json:"generation"` // the generation released (from_generation)
	// FromGeneration and ToGeneration are the row's generation before and
	// after the release.
	FromGeneration int64 `json:"from_generation"`
	ToGeneration   int64 `json:"to_generation"`
	// Action is "expired" (a pending row, now at to_generation with a stale
	// lease) or "reset" (a completed row, with --force: its response is
	// forgotten, and it is pending at to_generation with a stale lease).
	Action        string `json:"action"`
	Status        string `json:"status"` // the status the row had
	Forced        bool   `json:"forced"`
	SinceUpdateMS int64  `json:"since_update_ms"`
	AgeMS         int64  `json:"age_ms"`
}

func keysRelease(c *cli.Context, o *options, cn *conn, principal, key string, gen int64, ttl time.Duration, force bool) error {
	a, err := keysAdmin(o, cn, ttl)
	if err != nil {
		return err
	}
	who := fmt.Sprintf("key %s of principal %s", strconv.Quote(key), strconv.Quote(principal))
	res, err := a.Release(c.Context, principal, key, gen, idem.ReleaseOptions{Force: force})
	if errors.Is(err, idem.ErrKeyNotFound) {
		return fmt.Errorf("no %s on %s: nothing to release (it was never claimed, or was swept)", who, cn.where)
	}
	if err != nil {
		return ledgerErr("keys release", err)
	}
	k := &res.Before
	if !res.Released {
		switch {
		case k.Generation != gen:
			return fmt.Errorf("not released: %s is now at generation %d (%s, updated %s), not %d; look again with 'd1idem keys get'",
				who, k.Generation, display(string(k.Status)), formatAge(k.SinceUpdate()), gen)
		case k.Status == idem.StatusCompleted:
			return fmt.Errorf("not released: %s is completed (response %s): retries replay it; --force forgets the response, and the next retry executes the request again",
				who, statusOrDash(k.ResponseStatus))
		case k.Status == idem.StatusPending:
			return fmt.Errorf("not released: %s was updated %s, within the %s TTL: its owner is probably alive and renewing it; wait, or use --force",
				who, formatAge(k.SinceUpdate()), formatDuration(ttl))
		}
		return fmt.Errorf("not released: %s has status %s, which the ledger does not release", who, display(string(k.Status)))
	}
	reset := k.Status == idem.StatusCompleted
	if c.Bool(flagJSON) {
		action := "expired"
		if reset {
			action = "reset"
		}
		return printJSON(c.App.Writer, releaseJSON{Released: true, Principal: k.Principal, Key: k.Key, Generation: k.Generation,
			FromGeneration: k.Generation, ToGeneration: res.Generation,
			Action: action, Status: string(k.Status), Forced: force, SinceUpdateMS: k.SinceUpdate().Milliseconds(), AgeMS: k.Age().Milliseconds()})
	}
	w := c.App.Writer
	if reset {
		fmt.Fprintf(w, "Released %s: its completed row (response %s, completed %s) moved from generation %d to %d, pending with a stale lease.\n",
			who, statusOrDash(k.ResponseStatus), formatAge(k.SinceUpdate()), k.Generation, res.Generation)
		fmt.Fprintln(w, "The stored response is forgotten: the client's next request with this key (the same request) executes again.")
		return nil
	}
	fmt.Fprintf(w, "Released %s: its pending row moved from generation %d to %d with a stale lease (no update for %s, created %s).\n",
		who, k.Generation, res.Generation, formatDuration(k.SinceUpdate()), formatAge(k.Age()))
	fmt.Fprintln(w, "The client may retry now: its next request with this key (the same request) takes the key over and executes.")
	fmt.Fprintf(w, "The old owner (generation %d), if it is still running, may still perform its mutation, but its\n", k.Generation)
	fmt.Fprintf(w, "completion will be fenced out and not stored: the row is no longer at generation %d.\n", k.Generation)
	fmt.Fprintln(w, "An owner using the idem package learns at its next heartbeat that it has lost its lease.")
	return nil
}

func statusOrDash(s *int64) string {
	if s == nil {
		return "-"
	}
	return strconv.FormatInt(*s, 10)
}
