package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// quietRow is a pending row whose owner has missed its heartbeats but is
// still inside the default 30s TTL.
var quietRow = row{principal: "acct_7", key: "pay-2", status: "pending", generation: 1, created: 25 * time.Second, updated: 25 * time.Second}

func TestKeysStuckGolden(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, append(scenario, quietRow)...)
	r := mustRun(t, fixedClock(), l.args("keys", "stuck")...)
	golden(t, "keys_stuck", r.stdout)

	var out struct {
		TTLMS         int64 `json:"ttl_ms"`
		QuietAfterMS  int64 `json:"quiet_after_ms"`
		Total         int64 `json:"total"`
		OwnerQuiet    int64 `json:"owner_quiet"`
		AwaitingRetry int64 `json:"awaiting_retry"`
		Keys          []struct {
			Key           string `json:"key"`
			State         string `json:"state"`
			SinceUpdateMS int64  `json:"since_update_ms"`
			Stuck         bool   `json:"stuck"`
		} `json:"keys"`
	}
	r = mustRun(t, fixedClock(), l.args("keys", "stuck", "--json", "--limit", "2")...)
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	// The owner-quiet key first (it is the one to act on), then those
	// awaiting retry, oldest first: old-2 (30h), order-7 (12m3s); order-8
	// (5m) is left out by --limit 2 but counted; pay-1 (5s) is in flight.
	got := ""
	for _, k := range out.Keys {
		got += k.Key + "=" + k.State + " "
	}
	if out.Total != 4 || out.OwnerQuiet != 1 || out.AwaitingRetry != 3 || out.TTLMS != 30000 || out.QuietAfterMS != 20000 ||
		got != "pay-2=owner_quiet old-2=awaiting_retry order-7=awaiting_retry " || out.Keys[2].SinceUpdateMS != (12*time.Minute+3*time.Second).Milliseconds() {
		t.Errorf("keys stuck --json: %s\n%+v", got, out)
	}

	// A longer TTL leaves only the 30-hour-old key.
	r = mustRun(t, fixedClock(), l.args("keys", "stuck", "--ttl", "1h")...)
	if !strings.Contains(r.stdout, "old-2") || strings.Contains(r.stdout, "order-7") || !strings.Contains(r.stdout, "1 key past the 1h TTL, awaiting retry") ||
		strings.Contains(r.stdout, "keys release") {
		t.Errorf("keys stuck --ttl 1h:\n%s", r.stdout)
	}
}

// TestKeysStuckAfterRelease: a key just released is awaiting retry, and
// keys stuck neither calls it stuck for long nor suggests releasing it
// again.
func TestKeysStuckAfterRelease(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, quietRow)
	before := mustRun(t, fixedClock(), l.args("keys", "stuck")...)
	if !strings.Contains(before.stdout, "d1idem keys release --principal acct_7 --key pay-2 --generation 1 --force") {
		t.Fatalf("keys stuck does not suggest releasing the owner-quiet key:\n%s", before.stdout)
	}
	rel := mustRun(t, fixedClock(), l.args("keys", "release", "--principal", "acct_7", "--key", "pay-2", "--generation", "1", "--force")...)
	if !strings.Contains(rel.stdout, "generation 1 moved to 2") || !strings.Contains(rel.stdout, "takes the key over\nat generation 3 and executes") {
		t.Errorf("keys release tells another story of generations:\n%s", rel.stdout)
	}
	r := mustRun(t, fixedClock(), l.args("keys", "stuck")...)
	if !regexp.MustCompile(`acct_7 +pay-2 +2 +awaiting retry +30s ago`).MatchString(r.stdout) || strings.Contains(r.stdout, "keys release") ||
		!strings.Contains(r.stdout, "so a key just released is one of these") {
		t.Errorf("keys stuck after the release:\n%s", r.stdout)
	}
	r = mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_7", "--key", "pay-2")...)
	// Its last update (30s ago) is before its creation (25s ago): the
	// status says why, and the retry takes it over at the generation the
	// release promised.
	if !strings.Contains(r.stdout, "pending, awaiting retry: released 0s ago (a release sets the last update one TTL, 30s, back)") ||
		!strings.Contains(r.stdout, "takes the key over (generation 3)") || strings.Contains(r.stdout, "keys release") {
		t.Errorf("keys get after the release:\n%s", r.stdout)
	}
}

func TestKeysStuckNone(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario[2]) // in flight: updated 5s ago
	r := mustRun(t, fixedClock(), l.args("keys", "stuck")...)
	if r.stdout != "No stuck keys: every pending key was updated within the last 20s (a live owner renews every 10s).\n" {
		t.Errorf("got %q", r.stdout)
	}
	r = mustRun(t, fixedClock(), l.args("keys", "stuck", "--json")...)
	if !strings.Contains(r.stdout, `"keys": []`) || !strings.Contains(r.stdout, `"total": 0`) {
		t.Errorf("keys stuck --json with none:\n%s", r.stdout)
	}
}

func TestKeysGetGolden(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, append(scenario, quietRow)...)
	stuck := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_42", "--key", "order-7")...)
	quiet := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_7", "--key", "pay-2")...)
	completed := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_42", "--key", "order-1")...)
	inFlight := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_7", "--key", "pay-1")...)
	golden(t, "keys_get", "$ d1idem keys get --principal acct_42 --key order-7\n"+stuck.stdout+
		"\n$ d1idem keys get --principal acct_42 --key order-1\n"+completed.stdout+
		"\n$ d1idem keys get --principal acct_7 --key pay-1\n"+inFlight.stdout+
		"\n$ d1idem keys get --principal acct_7 --key pay-2\n"+quiet.stdout)

	r := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_42", "--key", "order-1", "--json")...)
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"principal", "key", "status", "generation", "fingerprint", "created_at", "created_at_ms", "updated_at",
		"updated_at_ms", "age_ms", "since_update_ms", "stuck", "response_status", "response_headers", "response_headers_raw",
		"response_body_bytes", "response_body", "ttl_ms"} {
		if _, ok := got[field]; !ok {
			t.Errorf("keys get --json lacks %q:\n%s", field, r.stdout)
		}
	}
	if h, _ := got["response_headers"].(map[string]any); h["location"] != "/v1/orders/17" {
		t.Errorf("response_headers = %v", got["response_headers"])
	}
	if got["updated_at"] != "2026-03-01T01:00:00.150Z" || got["response_status"] != 201.0 || got["status"] != "completed" {
		t.Errorf("keys get --json: %s", r.stdout)
	}
	if p, _ := got["response_body"].(string); len(p) != 358 || !strings.HasPrefix(p, `{"id":17,`) || got["response_body_bytes"] != 358.0 {
		t.Errorf("response_body = %q", p)
	}
}

func TestKeysGetNotFoundAndUsage(t *testing.T) {
	l := newSchemaDB(t, "ops")
	r := runCLI(t, fixedClock(), l.args("keys", "get", "--principal", "acct_42", "--key", "nope")...)
	if r.code != exitError || r.stdout != "" ||
		r.stderr != "d1idem: no key \"nope\" for principal \"acct_42\" on database ops (it was never claimed, or was swept)\n" {
		t.Errorf("not found: %s", r)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "get", "--key", "k"}, "--principal is required"},
		{[]string{"keys", "get", "--principal", "p"}, "--key is required"},
		{[]string{"keys", "get", "--principal", "p", "--key", "caf\u00e9"}, "is not an Idempotency-Key"},
		{[]string{"keys", "get", "--principal", "p", "--key", "k", "--ttl", "-1s"}, "--ttl -1s must be positive"},
		{[]string{"keys", "get", "--principal", "p", "--key", "k", "extra"}, "takes no arguments"},
		{[]string{"keys", "get", "--principal", "p", "--key", "k", "--ttl", "soon"}, "keys get: --ttl \"soon\" is not a duration"},
		{[]string{"keys", "get", "--principal", "a\xffb", "--key", "k"}, `--principal "a\xffb" (3 bytes) is not one the ledger holds: principals are 1 to 1024 bytes of UTF-8`},
		{[]string{"keys", "release", "--principal", strings.Repeat("p", 1025), "--key", "k", "--generation", "1"}, `--principal "` + strings.Repeat("p", 64) + `" (1,025 bytes) is not one the ledger holds`},
		// Valid UTF-8, too long: shown cut at a character boundary, so it
		// does not look like invalid UTF-8.
		{[]string{"keys", "get", "--principal", "x" + strings.Repeat("é", 600), "--key", "k"}, `--principal "x` + strings.Repeat(`\u00e9`, 31) + `" (1,201 bytes) is not one the ledger holds`},
		{[]string{"keys", "list", "--principal", "\xc3"}, `--principal "\xc3" (1 byte) is not one the ledger holds`},
	} {
		r := runCLI(t, fixedClock(), l.args(tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Errorf("%v: want exit 2 and one line with %q; %s", tc.args, tc.want, r)
		}
	}
}

// TestKeysGetOddValues shows values that are not plain text quoted, and a
// replay-headers value that is not JSON.
func TestKeysGetOddValues(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, row{principal: "tab\there", key: " spaced ", status: "completed", generation: 1, created: time.Minute, updated: time.Minute,
		respStatus: 500, headers: "not json", body: nil})
	r := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "tab\there", "--key", " spaced ")...)
	for _, want := range []string{`principal        "tab\there"`, `key              " spaced "`, `replay headers   "not json" (not a JSON object of strings`,
		"response body    NULL (no body stored"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in\n%s", want, r.stdout)
		}
	}
}

func TestKeysListGoldenAndFilters(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario...)
	r := mustRun(t, fixedClock(), l.args("keys", "list")...)
	golden(t, "keys_list", r.stdout)

	keysOf := func(args ...string) []string {
		t.Helper()
		r := mustRun(t, fixedClock(), l.args(append([]string{"keys", "list", "--json"}, args...)...)...)
		var out struct {
			Keys []struct {
				Key string `json:"key"`
			} `json:"keys"`
			NextCursor *string `json:"next_cursor"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		var keys []string
		for _, k := range out.Keys {
			keys = append(keys, k.Key)
		}
		return keys
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "old-1 old-2 order-1 order-7 order-8 pay-1"},
		{[]string{"--principal", "acct_42"}, "order-1 order-7 order-8"},
		{[]string{"--status", "pending"}, "old-2 order-7 order-8 pay-1"},
		{[]string{"--status", "completed", "--principal", "acct_9"}, "old-1"},
		{[]string{"--older-than", "10m"}, "old-1 old-2 order-1 order-7"},
		{[]string{"--older-than", "24h", "--status", "pending"}, "old-2"},
		{[]string{"--principal", "nobody"}, ""},
	} {
		if got := strings.Join(keysOf(tc.args...), " "); got != tc.want {
			t.Errorf("keys list %v = %q, want %q", tc.args, got, tc.want)
		}
	}
	r = mustRun(t, fixedClock(), l.args("keys", "list", "--principal", "nobody")...)
	if r.stdout != "No keys match.\n" {
		t.Errorf("empty list: %q", r.stdout)
	}
}

func TestKeysListPagination(t *testing.T) {
	l := newSchemaDB(t, "ops")
	// 23 rows; several share updated_at, so the order falls back to
	// principal and key, and pages must not lose or repeat any.
	var rows []row
	for i := range 23 {
		rows = append(rows, row{principal: fmt.Sprintf("p%d", i%3), key: fmt.Sprintf("k%02d", i), status: "completed", generation: 1,
			created: time.Hour, updated: time.Duration(i/4) * time.Minute, respStatus: 200, body: "{}", headers: "{}"})
	}
	l.insert(t, testNow, rows...)
	all := mustRun(t, fixedClock(), l.args("keys", "list", "--json", "--limit", "1000")...)
	var want struct {
		Keys []struct{ Principal, Key string } `json:"keys"`
	}
	if err := json.Unmarshal([]byte(all.stdout), &want); err != nil || len(want.Keys) != 23 {
		t.Fatalf("%v: %s", err, all.stdout)
	}

	var got []string
	cursor := ""
	pages := 0
	for {
		args := []string{"keys", "list", "--limit", "5"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		r := mustRun(t, fixedClock(), l.args(args...)...)
		pages++
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		cursor = ""
		if last := lines[len(lines)-1]; strings.HasPrefix(last, "next cursor: ") {
			cursor = strings.TrimPrefix(last, "next cursor: ")
			lines = lines[:len(lines)-1]
		}
		for _, line := range lines[1:] { // skip the header
			f := strings.Fields(line)
			got = append(got, f[0]+"/"+f[1])
		}
		if cursor == "" {
			break
		}
		// Stable: the same page asked twice gives the same cursor.
		again := mustRun(t, fixedClock(), l.args(args...)...)
		if again.stdout != r.stdout {
			t.Fatalf("page %d is not stable", pages)
		}
	}
	if pages != 5 {
		t.Errorf("%d pages of 5 for 23 rows, want 5", pages)
	}
	var wantKeys []string
	for _, k := range want.Keys {
		wantKeys = append(wantKeys, k.Principal+"/"+k.Key)
	}
	if strings.Join(got, " ") != strings.Join(wantKeys, " ") {
		t.Errorf("paged:\n%v\nwant:\n%v", got, wantKeys)
	}

	// --json carries next_cursor, null on the last page.
	r := mustRun(t, fixedClock(), l.args("keys", "list", "--json", "--limit", "20")...)
	var page struct {
		NextCursor *string `json:"next_cursor"`
	}
	_ = json.Unmarshal([]byte(r.stdout), &page)
	if page.NextCursor == nil {
		t.Fatal("no next_cursor with 3 more rows")
	}
	r = mustRun(t, fixedClock(), l.args("keys", "list", "--json", "--limit", "20", "--cursor", *page.NextCursor)...)
	var last struct {
		Keys       []json.RawMessage `json:"keys"`
		NextCursor *string           `json:"next_cursor"`
	}
	_ = json.Unmarshal([]byte(r.stdout), &last)
	if len(last.Keys) != 3 || last.NextCursor != nil || !strings.Contains(r.stdout, `"next_cursor": null`) {
		t.Errorf("last page: %s", r.stdout)
	}
}

func TestKeysListUsageErrors(t *testing.T) {
	l := newSchemaDB(t, "ops")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--status", "done"}, `--status "done" is not a status: use pending or completed`},
		{[]string{"--limit", "0"}, "--limit 0 is out of range: use 1 to 1000"},
		{[]string{"--limit", "1001"}, "--limit 1001 is out of range"},
		{[]string{"--older-than", "-5m"}, "--older-than -5m0s must be positive"},
		{[]string{"--cursor", "v1.bogus.12345678"}, "--cursor is not a cursor this command printed"},
		{[]string{"--limit", "ten"}, `keys list: --limit "ten" is not a whole number; give it as --limit 50`},
	} {
		r := runCLI(t, fixedClock(), l.args(append([]string{"keys", "list"}, tc.args...)...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: want exit 2 with %q; %s", tc.args, tc.want, r)
		}
	}
}

func TestKeysRelease(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario...)
	o := fixedClock()

	releaseStuckKey(t, l, o)
	releaseAtWrongGeneration(t, l, o)
	releaseCompletedNeedsForce(t, l, o)
	releaseLivePendingNeedsForce(t, l, o)

	// Usage errors.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--principal", "p", "--key", "k"}, "--generation is required: it fences the release"},
		{[]string{"--principal", "p", "--key", "k", "--generation", "0"}, "--generation 0 must be 1 or more"},
		{[]string{"--key", "k", "--generation", "1"}, "--principal is required"},
		{[]string{"--principal", "p", "--key", "k", "--generation", "one"}, `--generation "one" is not a whole number; give it as --generation 1`},
	} {
		r := runCLI(t, o, l.args(append([]string{"keys", "release"}, tc.args...)...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: want exit 2 with %q; %s", tc.args, tc.want, r)
		}
	}
}

// releaseStuckKey releases the stuck key acct_42/order-7 at its generation,
// and checks the row it leaves, the fence, a second release, that no
// release deletes a row, and the refusal of a missing key.
func releaseStuckKey(t *testing.T, l *ledgerDB, o *options) {
	t.Helper()
	// The stuck key at its generation: released.
	r := mustRun(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "1")...)
	golden(t, "keys_release", r.stdout)
	// The row stays, one generation on, with a lease stale by one
	// millisecond past the TTL: the ledger's one release rule.
	if n := l.count(t, "principal = 'acct_42' AND key = 'order-7' AND generation = 2 AND status = 'pending' AND updated_at = "+
		strconv.FormatInt(testNow.Add(-idem.DefaultTTL-time.Millisecond).UnixMilli(), 10)); n != 1 {
		t.Errorf("the released row is not at generation 2 with a lease stale by the TTL + 1ms")
	}
	// Again at generation 1: the fence refuses it.
	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, `not released: key "order-7" of principal "acct_42" is now at generation 2`) {
		t.Errorf("second release: %s", r)
	}
	// A released row is stuck at once: released again, it moves on again.
	r = mustRun(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "2", "--json")...)
	var again releaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &again); err != nil || !again.Released || again.FromGeneration != 2 || again.ToGeneration != 3 || again.Action != "expired" {
		t.Errorf("second release --json: %+v %v", again, err)
	}
	// No release deletes a row: a fresh claim would restart at generation 1.
	if r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-7", "--generation", "3", "--delete")...); r.code != exitUsage {
		t.Errorf("--delete is accepted: %s", r)
	}
	// A key that does not exist: nothing to release.
	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "nope", "--generation", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, `no key "nope" of principal "acct_42" on database ops: nothing to release`) {
		t.Errorf("missing key: %s", r)
	}
}

// releaseAtWrongGeneration checks that a release of acct_42/order-8 at a
// wrong generation says the current one, and deletes nothing; at the
// right one it releases.
func releaseAtWrongGeneration(t *testing.T, l *ledgerDB, o *options) {
	t.Helper()
	r := runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-8", "--generation", "1")...)
	if r.code != exitError || r.stderr != "d1idem: not released: key \"order-8\" of principal \"acct_42\" is now at generation 2 (awaiting retry, updated 5m ago), not 1; look again with 'd1idem keys get --principal acct_42 --key order-8"+l.hint()+"'\n" {
		t.Errorf("wrong generation: %s", r)
	}
	r = mustRun(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-8", "--generation", "2", "--json")...)
	var rel releaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &rel); err != nil || !rel.Released || rel.FromGeneration != 2 || rel.ToGeneration != 3 || rel.FromStatus != "pending" || rel.State != "awaiting_retry" ||
		rel.SinceUpdateMS != 300000 || rel.Forced {
		t.Errorf("release --json: %+v %v\n%s", rel, err, r.stdout)
	}
}

// releaseCompletedNeedsForce checks that the completed row acct_42/order-1
// is refused without --forget, --force included (an owner that completed
// since the operator looked keeps its response), and released, its
// response forgotten, with it.
func releaseCompletedNeedsForce(t *testing.T, l *ledgerDB, o *options) {
	t.Helper()
	r := runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-1", "--generation", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, "is completed (response 201): retries replay it; --forget forgets the response, and the next retry executes the request again") {
		t.Errorf("completed without --force: %s", r)
	}
	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-1", "--generation", "1", "--force")...)
	if r.code != exitError || !strings.Contains(r.stderr, "is completed (response 201)") {
		t.Errorf("completed with --force: %s", r)
	}
	if l.count(t, "key = 'order-1' AND status = 'completed'") != 1 {
		t.Fatal("a completed row was released without --forget")
	}
	r = mustRun(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-1", "--generation", "1", "--forget")...)
	if !strings.Contains(r.stdout, "its completed row (response 201, completed 2h ago) moved from generation 1 to 2:\nreleased, awaiting retry.") ||
		!strings.Contains(r.stdout, "next request with this key (the same request) executes again") ||
		l.count(t, "key = 'order-1' AND status = 'pending' AND generation = 2 AND response_status IS NULL AND response_body IS NULL") != 1 {
		t.Errorf("completed with --forget: %s", r)
	}
}

// releaseLivePendingNeedsForce checks that a pending row inside the TTL is
// refused without --force, saying whether its owner is renewing it, and
// released once older than --ttl.
func releaseLivePendingNeedsForce(t *testing.T, l *ledgerDB, o *options) {
	t.Helper()
	r := runCLI(t, o, l.args("keys", "release", "--principal", "acct_7", "--key", "pay-1", "--generation", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, "was updated 5s ago, inside the 30s TTL: its owner is alive and renewing it; wait, or use --force") {
		t.Errorf("fresh pending: %s", r)
	}
	l.insert(t, testNow, quietRow)
	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_7", "--key", "pay-2", "--generation", "1")...)
	if r.code != exitError || !strings.Contains(r.stderr, "was updated 25s ago, inside the 30s TTL, and its owner has missed its heartbeats: if you know it is dead, release it with --force") {
		t.Errorf("owner-quiet pending: %s", r)
	}
	r = runCLI(t, o, l.args("keys", "release", "--principal", "acct_7", "--key", "pay-1", "--generation", "1", "--ttl", "2s")...)
	if r.code != 0 || l.count(t, "key = 'pay-1' AND generation = 2") != 1 {
		t.Errorf("pending older than --ttl 2s: %s", r)
	}
}

// TestReleaseThenRetry walks the operator's story with the real ledger: an
// owner claims a key and dies; after the release the client's retry
// executes, and the old owner's late completion is fenced out.
func TestReleaseThenRetry(t *testing.T) {
	ctx := context.Background()
	l := newSchemaDB(t, "ops")
	clock := testNow.Add(-10 * time.Minute)
	ledger, err := idem.New(l.client, idem.Config{Clock: func() time.Time { return clock }, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.Fingerprint(http.MethodPost, "/v1/orders", http.Header{"Content-Type": {"application/json"}}, ledger.Config().FingerprintHeaders,
		strings.NewReader(`{"sku":"tea","qty":2}`))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := ledger.Begin(ctx, "acct_42", "order-9", fp)
	if err != nil || dead.Outcome != idem.Execute {
		t.Fatalf("claim: %+v %v", dead, err)
	}
	o := fixedClock()
	r := mustRun(t, o, l.args("keys", "stuck")...)
	if !regexp.MustCompile(`acct_42 +order-9 +1 +awaiting retry +10m ago`).MatchString(r.stdout) {
		t.Errorf("keys stuck:\n%s", r.stdout)
	}
	mustRun(t, o, l.args("keys", "release", "--principal", "acct_42", "--key", "order-9", "--generation", "1")...)

	// The client retries the same request: it takes the key over at once,
	// one generation past the old owner's.
	clock = testNow
	retry, err := ledger.Begin(ctx, "acct_42", "order-9", fp)
	if err != nil || retry.Outcome != idem.Execute || !retry.Reservation.Takeover || retry.Reservation.Generation != 3 {
		t.Fatalf("retry after release: %+v %v", retry, err)
	}
	// The old owner's heartbeat would now fail: its generation is gone.
	if ok, err := ledger.Renew(ctx, dead.Reservation); err != nil || ok {
		t.Fatalf("the old owner renewed its lease after the release: %v %v", ok, err)
	}
	c, err := ledger.Complete(ctx, retry.Reservation, idem.Response{Status: 201, Body: []byte(`{"id":1}`)})
	if err != nil || !c.Stored {
		t.Fatalf("retry's completion: %+v %v", c, err)
	}
	// The old owner wakes up: its generation-1 completion is fenced out.
	late, err := ledger.Complete(ctx, dead.Reservation, idem.Response{Status: 201, Body: []byte(`{"late":true}`)})
	if err != nil || late.Stored {
		t.Fatalf("late completion: %+v %v", late, err)
	}
	r = mustRun(t, o, l.args("keys", "get", "--principal", "acct_42", "--key", "order-9")...)
	if !regexp.MustCompile(`status +completed`).MatchString(r.stdout) || !strings.Contains(r.stdout, `{\"id\":1}`) {
		t.Errorf("after the retry:\n%s", r.stdout)
	}
}

// TestKeysD1Clock runs without an injected clock: ages and the TTL cutoff
// come from D1's own clock, as the ledger's do.
func TestKeysD1Clock(t *testing.T) {
	l := newSchemaDB(t, "ops")
	now := time.Now()
	l.insert(t, now, row{principal: "p", key: "stuck", status: "pending", generation: 1, created: 10 * time.Minute, updated: 10 * time.Minute},
		row{principal: "p", key: "fresh", status: "pending", generation: 1, created: time.Second, updated: time.Second})
	r := mustRun(t, nil, l.args("keys", "stuck")...)
	if !regexp.MustCompile(`p +stuck +1 +awaiting retry +10m([0-9]s)? ago`).MatchString(r.stdout) || strings.Contains(r.stdout, "fresh") {
		t.Errorf("keys stuck on D1's clock:\n%s", r.stdout)
	}
	r = mustRun(t, nil, l.args("keys", "get", "--principal", "p", "--key", "fresh")...)
	if !regexp.MustCompile(`updated +1s ago`).MatchString(r.stdout) {
		t.Errorf("keys get on D1's clock:\n%s", r.stdout)
	}
}

// TestKeysListLongValues: a key of 255 characters, the longest there is,
// is cut in the tables with an ellipsis, so that the other rows keep their
// width, and shown whole by keys get and --json.
func TestKeysListLongValues(t *testing.T) {
	l := newSchemaDB(t, "ops")
	long := strings.Repeat("k", 255)
	l.insert(t, testNow, scenario[0], row{principal: "acct_42", key: long, status: "pending", generation: 1, created: time.Minute, updated: time.Minute})
	cut := strings.Repeat("k", maxCell-1) + "…"
	for _, args := range [][]string{{"keys", "list"}, {"keys", "stuck"}} {
		r := mustRun(t, fixedClock(), l.args(args...)...)
		lines := strings.Split(r.stdout, "\n")
		if !strings.Contains(r.stdout, "acct_42    "+cut+"  ") || strings.Contains(r.stdout, long+" ") || len(lines[0]) > 150 {
			t.Errorf("%s:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	if r := mustRun(t, fixedClock(), l.args("keys", "get", "--principal", "acct_42", "--key", long)...); !strings.Contains(r.stdout, "key              "+long+"\n") {
		t.Errorf("keys get does not show the key whole:\n%s", r.stdout)
	}
	if r := mustRun(t, fixedClock(), l.args("keys", "list", "--json")...); !strings.Contains(r.stdout, `"key": "`+long+`"`) {
		t.Errorf("keys list --json does not carry the key whole")
	}
}
