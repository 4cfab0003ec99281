package cli

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

// Limits of keys list and keys stuck.
const (
	defaultListLimit = 50
	maxListLimit     = 1000
	previewBytes     = 200
)

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
	return &cli.IntFlag{Name: "limit", Value: defaultListLimit, Usage: fmt.Sprintf("show at most `N` rows (1 to %d)", maxListLimit)}
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
	if n < 1 || n > maxListLimit {
		return 0, usagef("--limit %d is out of range: use 1 to %d", n, maxListLimit)
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
	q := newQuery(o).add("SELECT "+summaryColumns+", ").now().
		add(", fingerprint, response_headers, response_body FROM "+d1idem.Table+" WHERE principal = ? AND key = ?", principal, key)
	res, err := cn.db.Exec(c.Context, []d1client.Statement{q.statement()})
	if err != nil {
		return fmt.Errorf("keys get: %w", err)
	}
	if len(res[0].Rows) == 0 {
		return fmt.Errorf("no key %s for principal %s on %s (it was never claimed, was released, or was swept)",
			strconv.Quote(key), strconv.Quote(principal), cn.where)
	}
	r := res[0].Rows[0]
	var k keyRow
	if err := r.Scan(&k.Principal, &k.Key, &k.Status, &k.Generation, &k.CreatedAt, &k.UpdatedAt, &k.ResponseStatus, &k.Now,
		&k.Fingerprint, &k.ResponseHeaders, &k.ResponseBody); err != nil {
		return fmt.Errorf("keys get: reading the row: %w", err)
	}
	headers, headersErr := k.headers()
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
			keySummaryJSON: k.summaryJSON(ttl), Fingerprint: k.Fingerprint,
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
	} else if k.Status == "completed" {
		bodyText = "NULL (no body stored: an oversized response is stored as status 500 with no body)"
	}
	if err := printFields(w, [][2]string{
		{"principal", display(k.Principal)},
		{"key", display(k.Key)},
		{"status", k.statusText(ttl)},
		{"generation", strconv.FormatInt(k.Generation, 10)},
		{"created", fmt.Sprintf("%s  (%s)", formatAge(k.age()), formatUTC(k.CreatedAt))},
		{"updated", fmt.Sprintf("%s  (%s)", formatAge(k.sinceUpdate()), formatUTC(k.UpdatedAt))},
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
	case k.stuck(ttl):
		fmt.Fprintf(w, "Its owner is presumed dead. The next retry of the same request takes the key over\n(generation %d) and executes it. To let it retry now, before the TTL has passed:\n  %s\n",
			k.Generation+1, release)
	case k.Status == "pending":
		fmt.Fprintf(w, "Its owner is presumably still running (a live owner renews the row every TTL/3).\nRetries get 409 %s until it completes, or until %s without an update.\n",
			idem.CodeKeyInProgress, formatDuration(ttl))
	case k.Status == "completed":
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
			status := c.String("status")
			if status != "" && status != "pending" && status != "completed" {
				return usagef("--status %s is not a status: use pending or completed", strconv.Quote(status))
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
			if _, err := positiveDuration(c, "ttl"); err != nil {
				return err
			}
			var after *cursor
			if tok := c.String("cursor"); tok != "" {
				cur, err := decodeCursor(tok)
				if err != nil {
					return usageError{err}
				}
				after = &cur
			}
			return withConn(c, o, func(cn *conn) error {
				return keysList(c, o, cn, status, limit, after)
			})
		},
	}
}

func keysList(c *cli.Context, o *options, cn *conn, status string, limit int, after *cursor) error {
	q := newQuery(o).add("SELECT " + summaryColumns + ", ").now().add(" FROM " + d1idem.Table)
	var where []func()
	if p := c.String("principal"); p != "" {
		where = append(where, func() { q.add("principal = ?", p) })
	}
	if status != "" {
		where = append(where, func() { q.add("status = ?", status) })
	}
	if c.IsSet("older-than") {
		d := c.Duration("older-than").Milliseconds()
		where = append(where, func() { q.add("updated_at < ").now().add(" - ?", d) })
	}
	if after != nil {
		where = append(where, func() {
			q.add("(updated_at, principal, key) > (?, ?, ?)", after.UpdatedAt, after.Principal, after.Key)
		})
	}
	for i, f := range where {
		if i == 0 {
			q.add(" WHERE ")
		} else {
			q.add(" AND ")
		}
		f()
	}
	q.add(" ORDER BY updated_at, principal, key LIMIT ?", limit+1)
	res, err := cn.db.Exec(c.Context, []d1client.Statement{q.statement()})
	if err != nil {
		return fmt.Errorf("keys list: %w", err)
	}
	var rows []keyRow
	for _, r := range res[0].Rows {
		k, err := scanSummary(r)
		if err != nil {
			return fmt.Errorf("keys list: reading a row: %w", err)
		}
		rows = append(rows, k)
	}
	var next *string
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		tok := cursor{UpdatedAt: last.UpdatedAt, Principal: last.Principal, Key: last.Key}.encode()
		next = &tok
	}
	if c.Bool(flagJSON) {
		out := struct {
			Keys       []keySummaryJSON `json:"keys"`
			NextCursor *string          `json:"next_cursor"`
		}{Keys: []keySummaryJSON{}, NextCursor: next}
		for _, k := range rows {
			out.Keys = append(out.Keys, k.summaryJSON(c.Duration("ttl")))
		}
		return printJSON(c.App.Writer, out)
	}
	w := c.App.Writer
	if len(rows) == 0 {
		if after != nil {
			fmt.Fprintln(w, "No more keys after the cursor.")
		} else {
			fmt.Fprintln(w, "No keys match.")
		}
		return nil
	}
	table := make([][]string, 0, len(rows))
	for _, k := range rows {
		resp := "-"
		if k.ResponseStatus != nil {
			resp = strconv.FormatInt(*k.ResponseStatus, 10)
		}
		status := display(k.Status)
		if k.stuck(c.Duration("ttl")) {
			status += " (stuck)"
		}
		table = append(table, []string{display(k.Principal), display(k.Key), status, strconv.FormatInt(k.Generation, 10), resp,
			formatAge(k.sinceUpdate()), formatUTC(k.UpdatedAt), formatAge(k.age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "STATUS", "GEN", "RESPONSE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	if next != nil {
		fmt.Fprintf(w, "next cursor: %s\n", *next)
	}
	return nil
}

// cursor is a position in the order of keys list: after this row.
type cursor struct {
	UpdatedAt int64
	Principal string
	Key       string
}

// A cursor token is "v1." + base64url(JSON [updated_at, principal, key]) +
// "." + the first 8 hex digits of the JSON's SHA-256. The digest catches a
// token cut short or edited by hand, which would otherwise resume at a
// wrong place without a word.
const cursorVersion = "v1"

func (cur cursor) encode() string {
	payload, _ := json.Marshal([]any{cur.UpdatedAt, cur.Principal, cur.Key})
	return cursorToken(payload)
}

func cursorToken(payload []byte) string {
	sum := sha256.Sum256(payload)
	return cursorVersion + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + hex.EncodeToString(sum[:4])
}

var errBadCursor = errors.New("--cursor is not a cursor this command printed (a \"next cursor\" token of 'd1idem keys list'); copy it whole, or start without --cursor")

func decodeCursor(tok string) (cursor, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != cursorVersion {
		return cursor{}, errBadCursor
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return cursor{}, errBadCursor
	}
	sum := sha256.Sum256(payload)
	if hex.EncodeToString(sum[:4]) != parts[2] {
		return cursor{}, errBadCursor
	}
	var fields []json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil || len(fields) != 3 {
		return cursor{}, errBadCursor
	}
	var cur cursor
	if json.Unmarshal(fields[0], &cur.UpdatedAt) != nil || json.Unmarshal(fields[1], &cur.Principal) != nil || json.Unmarshal(fields[2], &cur.Key) != nil {
		return cursor{}, errBadCursor
	}
	return cur, nil
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
	list := newQuery(o).add("SELECT "+summaryColumns+", ").now().
		add(" FROM "+d1idem.Table+" WHERE status = 'pending' AND updated_at < ").now().add(" - ?", ttl.Milliseconds()).
		add(" ORDER BY updated_at, principal, key LIMIT ?", limit)
	count := newQuery(o).add("SELECT count(*) FROM "+d1idem.Table+" WHERE status = 'pending' AND updated_at < ").now().
		add(" - ?", ttl.Milliseconds())
	res, err := cn.db.Exec(c.Context, []d1client.Statement{list.statement(), count.statement()})
	if err != nil {
		return fmt.Errorf("keys stuck: %w", err)
	}
	var rows []keyRow
	for _, r := range res[0].Rows {
		k, err := scanSummary(r)
		if err != nil {
			return fmt.Errorf("keys stuck: reading a row: %w", err)
		}
		rows = append(rows, k)
	}
	var total int64
	if err := res[1].Rows[0].Scan(&total); err != nil {
		return fmt.Errorf("keys stuck: reading the count: %w", err)
	}
	if c.Bool(flagJSON) {
		out := struct {
			TTLMS int64            `json:"ttl_ms"`
			Total int64            `json:"total"`
			Keys  []keySummaryJSON `json:"keys"`
		}{TTLMS: ttl.Milliseconds(), Total: total, Keys: []keySummaryJSON{}}
		for _, k := range rows {
			out.Keys = append(out.Keys, k.summaryJSON(ttl))
		}
		return printJSON(c.App.Writer, out)
	}
	w := c.App.Writer
	if len(rows) == 0 {
		fmt.Fprintf(w, "No stuck keys: no pending key has gone without an update for longer than the %s TTL.\n", formatDuration(ttl))
		return nil
	}
	table := make([][]string, 0, len(rows))
	for _, k := range rows {
		table = append(table, []string{display(k.Principal), display(k.Key), strconv.FormatInt(k.Generation, 10),
			formatDuration(k.sinceUpdate()), formatUTC(k.UpdatedAt), formatAge(k.age())})
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
		Description: `Releases one pending row, only at the generation given, in one statement:

   UPDATE idempotency_keys SET generation = generation + 1, updated_at = <an hour ago>
   WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending' ...

The generation moves past the old owner's, and the lease is made stale, so the
client's next request with the key takes it over at once (the same request, by
its fingerprint) and executes. The row is not deleted: a fresh claim would start
again at generation 1, which could be the old owner's own generation.

If another owner has taken the key over (a newer generation) or completed it in
the meantime, nothing changes and the command says what the row holds now.

The old owner, if it is still running, may still perform its mutation; its
completion is fenced by its generation and will not be stored. An owner using
the idem package learns at its next heartbeat that it lost its lease.

Only the same request (by its fingerprint) takes a released key over; a client
that changed its request gets 409 idempotency_key_reused, as the spec says (a new
operation takes a new key). If a different request must be allowed to use the
key, --delete deletes the pending row instead; do that only when the old owner
is certainly gone: a fresh claim restarts at generation 1, so an old owner of
generation 1 that is still running could complete the new request's row.

A pending row updated within the TTL probably has a live owner: it is refused
without --force. A completed row is refused without --force; with --force it is
deleted, and the next retry executes the request again instead of replaying.

   d1idem keys release --principal acct_42 --key order-7 --generation 1`,
		Flags: append([]cli.Flag{
			principalFlag("the `PRINCIPAL` the key belongs to"),
			keyFlag(),
			&cli.Int64Flag{Name: "generation", Usage: "the `GENERATION` to release, as 'keys get' or 'keys stuck' shows it (required: the fence)", DefaultText: "none, required"},
			&cli.BoolFlag{Name: "force", Usage: "also release a pending row updated within the TTL, or delete a completed row", DisableDefaultText: true},
			&cli.BoolFlag{Name: "delete", Usage: "delete the pending row instead of expiring it, so that a different request may use the key (see above)", DisableDefaultText: true},
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
				return keysRelease(c, o, cn, principal, key, gen, ttl, c.Bool("force"), c.Bool("delete"))
			})
		},
	}
}

// releaseJSON is keys release --json.
type releaseJSON struct {
	Released   bool   `json:"released"`
	Principal  string `json:"principal"`
	Key        string `json:"key"`
	Generation int64  `json:"generation"` // the generation released
	// Action is "expired" (a pending row, now at generation+1 with a stale
	// lease) or "deleted" (a completed row, with --force).
	Action        string `json:"action"`
	Status        string `json:"status"`
	Forced        bool   `json:"forced"`
	SinceUpdateMS int64  `json:"since_update_ms"`
	AgeMS         int64  `json:"age_ms"`
}

// releaseBackdate is how far back a released row's updated_at is set: past
// any realistic pending TTL, so the next retry takes the key over at once,
// and well inside any realistic retention, so the sweep leaves the row (and
// its generation) in place.
func releaseBackdate(ttl time.Duration) time.Duration { return max(time.Hour, 2*ttl) }

func keysRelease(c *cli.Context, o *options, cn *conn, principal, key string, gen int64, ttl time.Duration, force, del bool) error {
	// The row as it was, in the same transaction, before any change.
	before := newQuery(o).add("SELECT "+summaryColumns+", ").now().add(" FROM "+d1idem.Table+" WHERE principal = ? AND key = ?", principal, key)
	expire := newQuery(o)
	if del {
		expire.add("DELETE FROM "+d1idem.Table+" WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending'", principal, key, gen)
	} else {
		expire.add("UPDATE "+d1idem.Table+" SET generation = generation + 1, updated_at = ").now().
			add(" - ? WHERE principal = ? AND key = ? AND generation = ? AND status = 'pending'", releaseBackdate(ttl).Milliseconds(), principal, key, gen)
	}
	if !force {
		expire.add(" AND updated_at < ").now().add(" - ?", ttl.Milliseconds())
	}
	expire.add(" RETURNING generation")
	stmts := []d1client.Statement{before.statement(), expire.statement()}
	if force {
		stmts = append(stmts, newQuery(o).add("DELETE FROM "+d1idem.Table+" WHERE principal = ? AND key = ? AND generation = ? AND status = 'completed' RETURNING generation", principal, key, gen).statement())
	}
	res, err := cn.db.Exec(c.Context, stmts)
	if err != nil {
		return fmt.Errorf("keys release: %w", err)
	}
	who := fmt.Sprintf("key %s of principal %s", strconv.Quote(key), strconv.Quote(principal))
	if len(res[0].Rows) == 0 {
		return fmt.Errorf("no %s on %s: nothing to release (it was never claimed, or was swept)", who, cn.where)
	}
	k, err := scanSummary(res[0].Rows[0])
	if err != nil {
		return fmt.Errorf("keys release: reading the row: %w", err)
	}
	expired := len(res[1].Rows) == 1 && !del
	deleted := len(res[1].Rows) == 1 && del || force && len(res[2].Rows) == 1
	if !expired && !deleted {
		switch {
		case k.Generation != gen:
			return fmt.Errorf("not released: %s is now at generation %d (%s, updated %s), not %d; look again with 'd1idem keys get'",
				who, k.Generation, display(k.Status), formatAge(k.sinceUpdate()), gen)
		case k.Status == "completed":
			return fmt.Errorf("not released: %s is completed (response %s): retries replay it; --force deletes it, and the next retry executes the request again",
				who, statusOrDash(k.ResponseStatus))
		case k.Status == "pending":
			return fmt.Errorf("not released: %s was updated %s, within the %s TTL: its owner is probably alive and renewing it; wait, or use --force",
				who, formatAge(k.sinceUpdate()), formatDuration(ttl))
		}
		return fmt.Errorf("not released: %s has status %s; --force deletes it", who, display(k.Status))
	}
	if c.Bool(flagJSON) {
		action := "expired"
		if deleted {
			action = "deleted"
		}
		return printJSON(c.App.Writer, releaseJSON{Released: true, Principal: k.Principal, Key: k.Key, Generation: k.Generation,
			Action: action, Status: k.Status, Forced: force, SinceUpdateMS: k.Now - k.UpdatedAt, AgeMS: k.Now - k.CreatedAt})
	}
	w := c.App.Writer
	if deleted && k.Status == "pending" {
		fmt.Fprintf(w, "Released %s: deleted its pending row at generation %d (no update for %s, created %s).\n",
			who, k.Generation, formatDuration(k.sinceUpdate()), formatAge(k.age()))
		fmt.Fprintln(w, "The client's next request with this key, any request, claims the key afresh (at generation 1) and executes.")
		fmt.Fprintf(w, "Caution: should the old owner (generation %d) be alive after all, its completion could match the new claim's row.\n", k.Generation)
		return nil
	}
	if deleted {
		fmt.Fprintf(w, "Released %s: deleted its completed row at generation %d (response %s, completed %s).\n",
			who, k.Generation, statusOrDash(k.ResponseStatus), formatAge(k.sinceUpdate()))
		fmt.Fprintln(w, "The stored response is gone: the client's next request with this key executes again, as a new request.")
		return nil
	}
	fmt.Fprintf(w, "Released %s: its pending row moved from generation %d to %d with a stale lease (no update for %s, created %s).\n",
		who, k.Generation, k.Generation+1, formatDuration(k.sinceUpdate()), formatAge(k.age()))
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
