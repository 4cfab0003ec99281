package cli

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

func keysCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "keys",
		Usage:       "inspect and release idempotency keys",
		Description: help("keys"),
		Subcommands: []*cli.Command{keysGetCommand(o), keysListCommand(o), keysStuckCommand(o), keysReleaseCommand(o)},
	}
}

// Flags of the keys commands.

func principalFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: flagPrincipal, Usage: usage}
}

// Flags that name the principal: --principal-hex names one that no shell
// can pass as an argument, with a NUL byte (any UTF-8 is a principal).
const (
	flagPrincipal    = "principal"
	flagPrincipalHex = "principal-hex"
)

func principalHexFlag() cli.Flag {
	return &cli.StringFlag{Name: flagPrincipalHex, Usage: "the principal as the `HEX` of its bytes, in place of --principal: for one a shell cannot pass (with a NUL byte); printed commands use it then"}
}

// principalOf reads --principal, or --principal-hex; "" when neither is given.
func principalOf(c *cli.Context) (string, error) {
	p, h := c.String(flagPrincipal), c.String(flagPrincipalHex)
	switch {
	case h == "":
		return p, nil
	case p != "":
		return "", usagef("--%s and --%s both name the principal; pass one", flagPrincipal, flagPrincipalHex)
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return "", usagef("--%s %s is not the hex of the principal's bytes (two hex digits a byte, such as 61637431 for acct1)", flagPrincipalHex, strconv.Quote(h))
	}
	return string(b), nil
}

// Terminal-safe output. A value the CLI read (from the ledger, a database,
// D1's answers) may hold any UTF-8, and a terminal obeys the control
// characters it gets: ESC sequences retitle the window, clear the screen or
// rewrite what was printed. So nothing the CLI prints of such a value
// reaches the terminal raw unless it is printable, by the rule of package
// textsafe, which the console shares: textsafe.Display for a value in a
// table or a field (Go-quoted when not plain), textsafe.Escape for free text
// (errors, lines, cells), textsafe.ShellQuote for a value in a command
// printed to be pasted, textsafe.JSON for every JSON the CLI prints.

// principalArg names the principal p in a command line the CLI prints:
// --principal and p, quoted for the shell, or --principal-hex when p has a
// NUL byte, which no argument can hold.
func principalArg(p string) string {
	if strings.ContainsRune(p, 0) {
		return "--" + flagPrincipalHex + " " + hex.EncodeToString([]byte(p))
	}
	return "--" + flagPrincipal + " " + textsafe.ShellQuote(p)
}

// requiredMark ends the usage of a flag the command checks it has
// (urfave/cli v2's Required flags print the whole help when missing).
const requiredMark = " (required)"

func keyFlag() cli.Flag {
	return &cli.StringFlag{Name: "key", Usage: "the Idempotency-Key `KEY`, as the client sent it" + requiredMark}
}

func ttlFlag() cli.Flag {
	return &cli.DurationFlag{Name: "ttl", Value: idem.DefaultTTL, Usage: "the pending `TTL` the application uses: a pending key without an update for longer is taken over by the next retry"}
}

func heartbeatFlag() cli.Flag {
	return &cli.DurationFlag{Name: "heartbeat", Usage: "the `DURATION` between the application's renewals of a running request's key (idem.Config.Heartbeat): a pending key without an update for two heartbeats has an owner presumed dead",
		DefaultText: "a third of --ttl"}
}

// keysConfig reads --ttl and --heartbeat into the ledger configuration of
// the keys commands, which read and release but never sweep: the lease and
// the retention are set to what any TTL accepts.
func keysConfig(c *cli.Context) (idem.Config, error) {
	ttl, err := positiveDuration(c, "ttl")
	if err != nil {
		return idem.Config{}, err
	}
	hb := c.Duration("heartbeat")
	if c.IsSet("heartbeat") && (hb <= 0 || hb > ttl) {
		return idem.Config{}, usagef("--heartbeat %s is out of range: more than 0, at most --ttl (%s)", hb, ttl)
	}
	if hb == ttl {
		hb = ttl - time.Millisecond // the ledger's renewals come before the TTL
	}
	return idem.Config{TTL: ttl, Heartbeat: hb, MaxLease: ttl, Retention: max(idem.DefaultRetention, 2*ttl+idem.RetentionMargin)}, nil
}

func limitFlag() cli.Flag {
	return &cli.IntFlag{Name: "limit", Value: idem.DefaultListLimit, Usage: fmt.Sprintf("show at most `N` rows (1 to %d)", idem.MaxListLimit)}
}

// principalAndKey reads the principal and --key a command needs, in that
// order, refusing what no request can have.
func principalAndKey(c *cli.Context) (principal, key string, err error) {
	principal, err = principalOf(c)
	key = c.String("key")
	switch {
	case err != nil:
	case principal == "" || key == "":
		err = usagef("--%s is required; see 'd1idem %s --help'", pick(principal == "", flagPrincipal, "key"), commandPath(c))
	default:
		if err = checkPrincipal(principal); err == nil && !idem.ValidKey(key) {
			err = usagef("--key %s is not an Idempotency-Key: keys are 1 to 255 printable ASCII characters", strconv.Quote(key))
		}
	}
	return principal, key, err
}

func listLimit(c *cli.Context) (int, error) {
	n := c.Int("limit")
	if n < 1 || n > idem.MaxListLimit {
		return 0, usagef("--limit %d is out of range: use 1 to %d", n, idem.MaxListLimit)
	}
	return n, nil
}

// keysScope is what a keys command works on.
type keysScope struct {
	a     *idem.Admin
	cfg   idem.Config // the ledger's, its defaults filled in
	where string
	// On several databases: the ledger across them, and the set.
	ledger *idem.Ledger
	set    *dbSet
}

// withKeys runs a keys command: it reads --ttl and --heartbeat, and hands
// fn the administrative API of the ledger on the databases.
func (o *options) withKeys(c *cli.Context, fn func(ks *keysScope) error) error {
	if err := noArgs(c); err != nil {
		return err
	}
	cfg, err := keysConfig(c)
	if err != nil {
		return err
	}
	return o.withSet(c, existing, func(s *dbSet) error {
		l, err := o.ledger(s, cfg, false)
		if err != nil {
			return err
		}
		ks := &keysScope{a: l.Admin(), cfg: l.Config(), where: s.where()}
		if s.one() {
			return fn(ks)
		}
		ks.ledger, ks.set = l, s
		return ringFix(c, fn(ks))
	})
}

func keysGetCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "get",
		Usage:       "show one key: status, generation, ages, replay headers, body preview",
		Description: help("keys get"),
		Flags: append([]cli.Flag{
			principalFlag("the `PRINCIPAL` the key belongs to (the server-derived account or user ID)" + requiredMark),
			principalHexFlag(), keyFlag(), ttlFlag(), heartbeatFlag(), jsonFlag(),
		}, connFlags()...),
		Action: o.keysGet,
	}
}

func (o *options) keysGet(c *cli.Context) error {
	principal, key, err := principalAndKey(c)
	if err != nil {
		return err
	}
	return o.withKeys(c, func(ks *keysScope) error {
		k, err := ks.a.Get(c.Context, principal, key)
		if errors.Is(err, idem.ErrKeyNotFound) {
			return fmt.Errorf("no key %s for principal %s on %s (it was never claimed, or was swept)",
				strconv.Quote(key), strconv.Quote(principal), ks.where)
		} else if err != nil {
			return ledgerErr("keys get", err)
		}
		home, homeText, err := ks.home(c.Context, &k)
		if err != nil {
			return ledgerErr("keys get", err)
		}
		if c.Bool(flagJSON) {
			var db any
			if home != "" {
				db = field{"database", home}
			}
			return printObject(c.App.Writer, k, field{"ttl_ms", ks.cfg.TTL.Milliseconds()}, db)
		}
		return renderKey(c.App.Writer, &k, ks.a.Explain(&k), releaseCommandLine(c, &k), homeText)
	})
}

// releaseCommandLine is the command that releases k at its generation:
// with --force when the row is inside its TTL, which the ledger then
// requires.
func releaseCommandLine(c *cli.Context, k *idem.KeyRecord) string {
	force := ""
	if k.State != idem.KeyAwaitingRetry {
		force = " --force"
	}
	// The release backdates the row by the TTL: it must be the
	// application's.
	force += setDurations(c, "ttl", "heartbeat")
	return fmt.Sprintf("d1idem keys release %s --key %s --generation %d%s%s",
		principalArg(k.Principal), textsafe.ShellQuote(k.Key), k.Generation, force, connHint(c))
}

func keysListCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "list",
		Usage:       "list keys, oldest update first, filtered and paginated",
		Description: help("keys list"),
		Flags: append([]cli.Flag{
			principalFlag("only keys of this `PRINCIPAL`"),
			principalHexFlag(),
			&cli.StringFlag{Name: "status", Usage: "only keys with this `STATUS`: pending or completed"},
			&cli.DurationFlag{Name: "older-than", Usage: "only keys whose last update is older than `DURATION` (e.g. 10m, 24h)", DefaultText: "any age"},
			limitFlag(), ttlFlag(), heartbeatFlag(),
			&cli.StringFlag{Name: "cursor", Usage: "continue after the page that printed this `TOKEN` as its next cursor"},
			jsonFlag(),
		}, connFlags()...),
		Action: o.keysList,
	}
}

func (o *options) keysList(c *cli.Context) error {
	opts, err := listOptions(c)
	if err != nil {
		return err
	}
	return o.withKeys(c, func(ks *keysScope) error {
		page, err := ks.a.List(c.Context, opts)
		if errors.Is(err, idem.ErrBadCursor) {
			return usagef("--cursor is not a cursor this command printed (a \"next cursor\" token of 'd1idem keys list'); copy it whole, or start without --cursor")
		} else if err != nil {
			return ledgerErr("keys list", err)
		}
		if c.Bool(flagJSON) {
			var next *string
			if page.NextCursor != "" {
				next = &page.NextCursor
			}
			return printObject(c.App.Writer, field{"keys", rows(page.Keys)}, field{"next_cursor", next})
		}
		return renderKeyPage(c.App.Writer, page, opts.Cursor != "")
	})
}

// rows are keys, never nil: an empty list is [] in JSON.
func rows(keys []idem.KeyRecord) []idem.KeyRecord {
	if keys == nil {
		return []idem.KeyRecord{}
	}
	return keys
}

// checkPrincipal refuses a --principal no request can have (see
// idem.ValidPrincipal); "" is keys list's "any principal".
func checkPrincipal(p string) error {
	if p == "" || idem.ValidPrincipal(p) {
		return nil
	}
	shown, _ := preview(p, 64)
	return usagef("--principal %s (%s) is not one the ledger holds: principals are 1 to %d bytes of UTF-8",
		strconv.QuoteToASCII(shown), human.Plural(int64(len(p)), "byte", "bytes"), idem.MaxPrincipalLength)
}

// listOptions reads the filters of keys list.
func listOptions(c *cli.Context) (idem.ListOptions, error) {
	opts := idem.ListOptions{OlderThan: c.Duration("older-than"), Cursor: c.String("cursor")}
	var err error
	if opts.Principal, err = principalOf(c); err != nil {
		return opts, err
	}
	if err := checkPrincipal(opts.Principal); err != nil {
		return opts, err
	}
	if s := c.String("status"); s != "" {
		if opts.Status, err = idem.ParseStatus(s); err != nil {
			return opts, usagef("--status %s is not a status: use %s or %s", strconv.Quote(s), idem.StatusPending, idem.StatusCompleted)
		}
	}
	if c.IsSet("older-than") {
		if _, err := positiveDuration(c, "older-than"); err != nil {
			return opts, err
		}
	}
	opts.Limit, err = listLimit(c)
	return opts, err
}

func keysStuckCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "stuck",
		Usage:       "list pending keys whose owner has gone quiet: the first thing to look at",
		Description: help("keys stuck"),
		Flags:       append([]cli.Flag{ttlFlag(), heartbeatFlag(), limitFlag(), jsonFlag()}, connFlags()...),
		Action:      o.keysStuck,
	}
}

func (o *options) keysStuck(c *cli.Context) error {
	limit, err := listLimit(c)
	if err != nil {
		return err
	}
	return o.withKeys(c, func(ks *keysScope) error {
		st, err := ks.a.Stuck(c.Context, limit)
		if err != nil {
			return ledgerErr("keys stuck", err)
		}
		if c.Bool(flagJSON) {
			return printJSON(c.App.Writer, st)
		}
		release := ""
		if len(st.OwnerQuiet) > 0 {
			release = releaseCommandLine(c, &st.OwnerQuiet[0])
		}
		return renderStuck(c.App.Writer, st, ks.cfg.Heartbeat, release)
	})
}

func keysReleaseCommand(o *options) *cli.Command {
	return &cli.Command{
		Name:        "release",
		Usage:       "release a pending key whose owner died, fenced by its generation, so the client may retry now",
		Description: help("keys release"),
		Flags: append([]cli.Flag{
			principalFlag("the `PRINCIPAL` the key belongs to" + requiredMark),
			principalHexFlag(), keyFlag(),
			requiredInt64Flag{&cli.Int64Flag{Name: "generation", Usage: "the `GENERATION` to release, as 'keys get' or 'keys stuck' shows it: the fence" + requiredMark}},
			&cli.BoolFlag{Name: "force", Usage: "also release a pending row inside the TTL (a row completed since you looked keeps its response)", DisableDefaultText: true},
			&cli.BoolFlag{Name: "forget", Usage: "also release a completed row, forgetting its response: the next retry executes again", DisableDefaultText: true},
			ttlFlag(), heartbeatFlag(), jsonFlag(),
		}, connFlags()...),
		Action: o.keysRelease,
	}
}

func (o *options) keysRelease(c *cli.Context) error {
	principal, key, err := principalAndKey(c)
	if err != nil {
		return err
	}
	gen, err := releaseGeneration(c)
	if err != nil {
		return err
	}
	return o.withKeys(c, func(ks *keysScope) error {
		forget := c.Bool("forget")
		res, err := ks.a.Release(c.Context, principal, key, gen, idem.ReleaseOptions{Force: c.Bool("force") || forget, PendingOnly: !forget})
		if errors.Is(err, idem.ErrKeyNotFound) {
			return fmt.Errorf("no %s on %s: nothing to release (it was never claimed, or was swept)", keyName(principal, key), ks.where)
		} else if err != nil {
			return ledgerErr("keys release", err)
		}
		if !res.Released {
			return notReleased(&res.Before, gen, ks.cfg.TTL, getCommandLine(c, &res.Before))
		}
		if c.Bool(flagJSON) {
			return printJSON(c.App.Writer, res)
		}
		return renderRelease(c.App.Writer, res, connHint(c))
	})
}

func releaseGeneration(c *cli.Context) (int64, error) {
	if !c.IsSet("generation") {
		return 0, usagef("--generation is required: it fences the release to the row you looked at (see 'd1idem keys get')")
	}
	gen := c.Int64("generation")
	if gen < 1 {
		return 0, usagef("--generation %d must be 1 or more", gen)
	}
	return gen, nil
}

func keyName(principal, key string) string {
	return fmt.Sprintf("key %s of principal %s", strconv.Quote(key), strconv.Quote(principal))
}

// getCommandLine is the command that shows the row k.
func getCommandLine(c *cli.Context, k *idem.KeyRecord) string {
	return fmt.Sprintf("d1idem keys get %s --key %s%s%s", principalArg(k.Principal), textsafe.ShellQuote(k.Key), connHint(c), setDurations(c, "ttl", "heartbeat"))
}

// notReleased says why the ledger left the row k alone; look shows it.
func notReleased(k *idem.KeyRecord, gen int64, lease time.Duration, look string) error {
	who, ttl := keyName(k.Principal, k.Key), human.Duration(lease)
	switch {
	case k.Generation != gen:
		return fmt.Errorf("not released: %s is now at generation %d (%s, updated %s), not %d; look again with '%s'",
			who, k.Generation, k.State.Words(), human.Age(k.SinceUpdate()), gen, look)
	case k.State == idem.KeyCompleted:
		return fmt.Errorf("not released: %s is completed (response %s): retries replay it; --forget forgets the response, and the next retry executes the request again",
			who, human.OrDash(k.ResponseStatus))
	case k.State == idem.KeyOwnerQuiet:
		return fmt.Errorf("not released: %s was updated %s, inside the %s TTL, and its owner has missed its heartbeats: if you know it is dead, release it with --force",
			who, human.Age(k.SinceUpdate()), ttl)
	case k.State == idem.KeyInFlight:
		return fmt.Errorf("not released: %s was updated %s, inside the %s TTL: its owner is alive and renewing it; wait, or use --force",
			who, human.Age(k.SinceUpdate()), ttl)
	}
	return fmt.Errorf("not released: %s has status %s, which the ledger does not release", who, textsafe.Display(string(k.Status)))
}

// previewBytes is how much of a stored body keys get shows.
const previewBytes = 200

// renderKey writes keys get for people: the row's fields (home: which
// database holds it), what the next retry gets, and what to do.
func renderKey(w io.Writer, k *idem.KeyRecord, e idem.Explanation, release, home string) error {
	var fields [][2]string
	if home != "" {
		fields = append(fields, [2]string{"database", home})
	}
	if err := printFields(w, append(fields, [][2]string{
		{"principal", textsafe.Display(k.Principal)},
		{"key", textsafe.Display(k.Key)},
		{"status", statusText(k, e)},
		{"generation", strconv.FormatInt(k.Generation, 10)},
		{"created", fmt.Sprintf("%s  (%s)", human.Age(k.Age()), human.Time(k.CreatedAt))},
		{"updated", fmt.Sprintf("%s  (%s)", human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt))},
		{"fingerprint", textsafe.Display(k.Fingerprint)},
		{"response status", human.OrDash(k.ResponseStatus)},
		{"replay headers", headersText(k)},
		{"response body", bodyText(k)},
	}...)); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, line := range []string{e.Next, e.Remedy} {
		if line != "" {
			fmt.Fprintln(w, wrap(textsafe.Escape(line)))
		}
	}
	if e.Release != nil {
		fmt.Fprintf(w, "  %s\n", release)
	}
	return nil
}

// statusText is the row's status and state, and why: "pending, owner
// quiet: no update for 25s ...".
func statusText(k *idem.KeyRecord, e idem.Explanation) string {
	switch e.State {
	case idem.KeyCompleted:
		return "completed: " + e.Reason
	case idem.KeyUnknown:
		return textsafe.Display(string(k.Status)) + " (" + e.Reason + ")"
	}
	return fmt.Sprintf("%s, %s: %s", k.Status, e.State.Words(), e.Reason)
}

// headersText shows the stored replay headers, one per line.
func headersText(k *idem.KeyRecord) string {
	headers, err := k.StoredHeaders()
	switch {
	case err != nil:
		return fmt.Sprintf("%s (not a JSON object of strings: %v)", strconv.Quote(*k.ResponseHeaders), err)
	case k.ResponseHeaders != nil && len(headers) == 0:
		return "(none)"
	case len(headers) == 0:
		return "-"
	}
	var lines []string
	for _, n := range slices.Sorted(maps.Keys(headers)) {
		lines = append(lines, textsafe.Display(n)+": "+textsafe.Display(headers[n]))
	}
	return strings.Join(lines, "\n")
}

// bodyText shows the stored body's size and its first bytes, quoted.
func bodyText(k *idem.KeyRecord) string {
	if k.ResponseBody == nil {
		if k.Status == idem.StatusCompleted {
			return "NULL (no body stored: an oversized response is stored as status 500 with no body)"
		}
		return "-"
	}
	p, more := preview(*k.ResponseBody, previewBytes)
	s := fmt.Sprintf("%s, %s", human.Plural(int64(len(*k.ResponseBody)), "byte", "bytes"), strconv.Quote(p))
	if more > 0 {
		s += fmt.Sprintf(" ... (%d more bytes)", more)
	}
	return s
}

// renderKeyPage writes keys list for people: a table, then the next cursor.
func renderKeyPage(w io.Writer, page idem.KeyPage, continued bool) error {
	if len(page.Keys) == 0 {
		if continued {
			_, err := fmt.Fprintln(w, "No more keys after the cursor.")
			return err
		}
		_, err := fmt.Fprintln(w, "No keys match.")
		return err
	}
	table := make([][]string, 0, len(page.Keys))
	for i := range page.Keys {
		k := &page.Keys[i]
		status := textsafe.Display(string(k.Status))
		if k.State != idem.KeyCompleted && k.State != idem.KeyUnknown {
			status += " (" + k.State.Words() + ")"
		}
		table = append(table, []string{cell(k.Principal), cell(k.Key), status, strconv.FormatInt(k.Generation, 10),
			human.OrDash(k.ResponseStatus), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt), human.Age(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "STATUS", "GEN", "RESPONSE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	if page.NextCursor != "" {
		_, err := fmt.Fprintf(w, "next cursor: %s\n", page.NextCursor)
		return err
	}
	return nil
}

// renderStuck writes keys stuck for people: the owner-quiet keys, then
// those awaiting retry, and what to do about each group.
func renderStuck(w io.Writer, st idem.StuckKeys, heartbeat time.Duration, release string) error {
	ttl, total := human.Duration(st.TTL), st.NOwnerQuiet+st.NAwaitingRetry
	if total == 0 {
		_, err := fmt.Fprintf(w, "No stuck keys: every pending key was updated within the last %s (a live owner renews every %s).\n",
			human.Duration(st.QuietAfter), human.Duration(heartbeat))
		return err
	}
	var table [][]string
	for _, k := range append(append([]idem.KeyRecord{}, st.OwnerQuiet...), st.AwaitingRetry...) {
		table = append(table, []string{cell(k.Principal), cell(k.Key), strconv.FormatInt(k.Generation, 10),
			k.State.Words(), human.Age(k.SinceUpdate()), human.Time(k.UpdatedAt), human.Age(k.Age())})
	}
	if err := printTable(w, []string{"PRINCIPAL", "KEY", "GEN", "STATE", "UPDATED", "UPDATED (UTC)", "CREATED"}, table); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if st.Partial {
		fmt.Fprintf(w, "There are more than %d pending keys without a recent update; the counts below are of the oldest %[1]d.\n", total)
	}
	if st.NAwaitingRetry > 0 {
		fmt.Fprintf(w, "%s past the %s TTL, awaiting retry%s: the next retry of the same request takes each over,\nat the next generation, and executes it. Nothing needs releasing: a release sets a key's last update\none TTL back, so a key just released is one of these.\n",
			human.Plural(st.NAwaitingRetry, "key", "keys"), ttl, shownOf(st.NAwaitingRetry, len(st.AwaitingRetry)))
	}
	if st.NOwnerQuiet > 0 {
		fmt.Fprintf(w, "%s inside the %s TTL whose owner has missed its heartbeats%s: retries get 409 until the TTL\nhas passed. To let the client retry now, release the key (fenced by its generation; --force, since\nthe ledger cannot prove the owner dead):\n  %s\n",
			human.Plural(st.NOwnerQuiet, "key", "keys"), ttl, shownOf(st.NOwnerQuiet, len(st.OwnerQuiet)), release)
	}
	return nil
}

// shownOf notes when fewer rows are shown than there are.
func shownOf(total int64, shown int) string {
	if total > int64(shown) {
		return fmt.Sprintf(" (the %d oldest shown; raise --limit for more)", shown)
	}
	return ""
}

// renderRelease writes what keys release did and what happens next.
func renderRelease(w io.Writer, res idem.ReleaseResult, hint string) error {
	k := &res.Before
	who := keyName(k.Principal, k.Key)
	if k.Status == idem.StatusCompleted {
		fmt.Fprintf(w, "Released %s: its completed row (response %s, completed %s) moved from generation %d to %d:\nreleased, awaiting retry.\n",
			who, human.OrDash(k.ResponseStatus), human.Age(k.SinceUpdate()), k.Generation, res.Generation)
		fmt.Fprintf(w, "The stored response is forgotten: the client's next request with this key (the same request) executes again,\nat generation %d.\n", res.Generation+1)
	} else {
		fmt.Fprintf(w, "Released %s: generation %d moved to %d (no update for %s, created %s);\nthe key is released, awaiting retry.\n",
			who, k.Generation, res.Generation, human.Duration(k.SinceUpdate()), human.Age(k.Age()))
		fmt.Fprintf(w, "The client may retry now: its next request with this key (the same request) takes the key over\nat generation %d and executes.\n", res.Generation+1)
		fmt.Fprintf(w, "The old owner (generation %d), if it is still running, may still perform its mutation, but its\n", k.Generation)
		fmt.Fprintf(w, "completion will be fenced out and not stored: the row is no longer at generation %d.\n", k.Generation)
		fmt.Fprintln(w, "An owner using the idem package learns at its next heartbeat that it has lost its lease.")
	}
	_, err := fmt.Fprintf(w, "See the row: d1idem keys get %s --key %s%s\n", principalArg(k.Principal), textsafe.ShellQuote(k.Key), hint)
	return err
}

// home names the database that holds k on several databases; "" on one.
// While the ring moves k's principal, text says so, for people.
func (ks *keysScope) home(ctx context.Context, k *idem.KeyRecord) (label, text string, err error) {
	if ks.ledger == nil {
		return "", "", nil
	}
	r, err := ks.ledger.Ring(ctx)
	if err != nil {
		return "", "", err
	}
	label, now, old := ks.set.label(k.Home), r.Home(k.Principal), r.PreviousHome(k.Principal)
	switch {
	case old == "":
		return label, label, nil
	case k.Home == old:
		return label, fmt.Sprintf("%s (the principal's home before version %d; its new keys go to %s)", label, r.Version, ks.set.label(now)), nil
	}
	return label, fmt.Sprintf("%s (the principal's home since version %d, moved from %s)", label, r.Version, ks.set.label(old)), nil
}
