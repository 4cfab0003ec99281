package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestStatsGolden(t *testing.T) {
	l := newSchemaDB(t, "ops")
	l.insert(t, testNow, scenario...)
	r := mustRun(t, fixedClock(), l.args("stats")...)
	// The database size depends on SQLite's page layout; its shape is
	// checked here, and normalised in the golden file.
	size := regexp.MustCompile(`(?m)^database size   (\d+) bytes \(\d+\.\d KiB\)$`)
	if !size.MatchString(r.stdout) {
		t.Errorf("no database size line:\n%s", r.stdout)
	}
	golden(t, "stats", size.ReplaceAllString(r.stdout, "database size   <N> bytes"))

	r = mustRun(t, fixedClock(), l.args("stats", "--json")...)
	var s statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatal(err)
	}
	if s.Keys != 6 || s.ByStatus["pending"] != 4 || s.ByStatus["completed"] != 2 || s.Stuck != 3 || s.SweepBacklog != 2 ||
		s.Oldest == nil || s.Oldest.Key != "old-1" || s.OldestStuck == nil || s.OldestStuck.Key != "old-2" || s.SizeBytes <= 0 ||
		s.TTLMS != 30000 || s.RetentionMS != 86400000 || s.Database != "database ops" {
		t.Errorf("stats --json: %s", r.stdout)
	}
	for _, field := range []string{"database", "keys", "by_status", "ttl_ms", "stuck", "oldest_stuck", "oldest", "retention_ms", "sweep_backlog", "size_bytes"} {
		if !strings.Contains(r.stdout, `"`+field+`":`) {
			t.Errorf("stats --json lacks %q", field)
		}
	}

	r = mustRun(t, fixedClock(), l.args("stats", "--ttl", "1h", "--retention", "72h")...)
	if !strings.Contains(r.stdout, "awaiting retry  1 pending past the 1h TTL, taken over by their next retry (the oldest: acct_9 / old-2, updated 30h ago); see 'd1idem keys stuck"+l.hint()+" --ttl 1h'") ||
		!strings.Contains(r.stdout, "sweep backlog   1 row older than the 3d retention: 'd1idem sweep --all"+l.hint()+" --retention 72h' deletes it\n") {
		t.Errorf("stats --ttl 1h --retention 72h:\n%s", r.stdout)
	}
}

func TestStatsEmpty(t *testing.T) {
	l := newSchemaDB(t, "ops")
	r := mustRun(t, fixedClock(), l.args("stats")...)
	for _, want := range []string{"keys            0\n", "awaiting retry  none: no pending key is past the 30s TTL\n", "oldest row      -\n", "sweep backlog   none older than the 24h retention\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, fixedClock(), l.args("stats", "--json")...)
	if !strings.Contains(r.stdout, `"oldest": null`) || !strings.Contains(r.stdout, `"pending": 0`) {
		t.Errorf("stats --json on an empty ledger:\n%s", r.stdout)
	}
}

func TestStatsMissingTable(t *testing.T) {
	l := newLedgerDB(t, "ops")
	r := runCLI(t, fixedClock(), l.args("stats")...)
	if r.code != exitError || strings.Count(r.stderr, "\n") != 1 ||
		!strings.HasSuffix(r.stderr, "no such table: idempotency_keys: SQLITE_ERROR; the ledger table is missing: run 'd1idem schema apply"+l.hint()+"'\n") {
		t.Errorf("stats without the table: %s", r)
	}
}

// backlog inserts n rows past the 24h retention and two recent ones.
func backlog(t *testing.T, l *ledgerDB, n int) {
	var rows []row
	for i := range n {
		rows = append(rows, row{principal: "p", key: fmt.Sprintf("old-%03d", i), status: "completed", generation: 1,
			created: 50 * time.Hour, updated: 25*time.Hour + time.Duration(i)*time.Second, respStatus: 200, body: "{}", headers: "{}"})
	}
	rows = append(rows, row{principal: "p", key: "recent", status: "completed", generation: 1, created: time.Hour, updated: time.Hour},
		row{principal: "p", key: "pending", status: "pending", generation: 1, created: time.Minute, updated: time.Minute})
	l.insert(t, testNow, rows...)
}

func TestSweep(t *testing.T) {
	l := newSchemaDB(t, "ops")
	backlog(t, l, 45)
	o := fixedClock()

	r := mustRun(t, o, l.args("sweep", "--dry-run")...)
	if r.stdout != "Dry run: 45 rows last updated more than 24h ago would be deleted (3 batches of 20 with --all; one sweep without --all deletes 20). Nothing was deleted.\n" {
		t.Errorf("dry run: %q", r.stdout)
	}
	if l.count(t, "1") != 47 {
		t.Fatal("--dry-run deleted rows")
	}
	r = mustRun(t, o, l.args("sweep", "--dry-run", "--json", "--retention", "25h10s")...)
	var dj sweepJSON
	if err := json.Unmarshal([]byte(r.stdout), &dj); err != nil || !dj.DryRun || dj.WouldDelete == nil || *dj.WouldDelete != 34 || dj.D1Calls != 1 {
		t.Errorf("dry run --json: %v %s", err, r.stdout)
	}

	// One batch without --all.
	r = mustRun(t, o, l.args("sweep")...)
	if !regexp.MustCompile(`^Swept 20 rows last updated more than 24h ago in 1 batch of at most 20 \(1 D1 call, \d+(ms|s|\.\d+s)\); more remain: run again with --all\.\n$`).MatchString(r.stdout) {
		t.Errorf("one batch: %q", r.stdout)
	}
	// The rest with --all: 20, then 5 (short: done).
	r = mustRun(t, o, l.args("sweep", "--all", "--json")...)
	var sj sweepJSON
	if err := json.Unmarshal([]byte(r.stdout), &sj); err != nil || sj.Deleted != 25 || sj.Batches != 2 || !sj.Complete || sj.D1Calls != 2 || sj.BudgetWaits != 0 {
		t.Errorf("--all --json: %v %s", err, r.stdout)
	}
	if l.count(t, "1") != 2 || l.count(t, "key IN ('recent', 'pending')") != 2 {
		t.Errorf("the sweep deleted the wrong rows")
	}
	r = mustRun(t, o, l.args("sweep", "--all")...)
	if !strings.HasPrefix(r.stdout, "Swept 0 rows") || !strings.Contains(r.stdout, "the backlog is clear.") {
		t.Errorf("nothing left: %q", r.stdout)
	}
}

func TestSweepUsageErrors(t *testing.T) {
	l := newSchemaDB(t, "ops")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "0"}, "--batch 0 is out of range: use 1 to 1000"},
		{[]string{"--batch", "1001"}, "--batch 1001 is out of range"},
		{[]string{"--retention", "10s"}, "--retention 10s is out of range: use MaxLease (10m0s) + TTL (30s) + 1m0s = 11m30s to"},
		{[]string{"--retention", "10m"}, "--retention 10m0s is out of range"},
		{[]string{"--retention", "0"}, "--retention 0s must be positive"},
		{[]string{"--retention", "-1h"}, "--retention -1h0m0s must be positive"},
		{[]string{"--max-calls", "-1"}, "--max-calls -1 must not be negative"},
		{[]string{"--max-calls", "0"}, "--max-calls 0 (unlimited) is only allowed with --local"},
		{[]string{"--max-calls", "1200"}, "--max-calls 1200 leaves nothing of the account's 1200 calls per 5 minutes to the application"},
		{[]string{"--max-calls", "99999"}, "--max-calls 99999 leaves nothing"},
		{[]string{"--retention", "a day"}, `sweep: --retention "a day" is not a duration (a number with its unit: ms, s, m or h); give it as --retention 24h`},
	} {
		r := runCLI(t, fixedClock(), l.args(append([]string{"sweep"}, tc.args...)...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: want exit 2 with %q; %s", tc.args, tc.want, r)
		}
	}
}

// TestSweepBudget: the sweep stays within --max-calls per window, and says
// when it waits. The window is shortened to 300ms for the test.
func TestSweepBudget(t *testing.T) {
	l := newSchemaDB(t, "ops")
	backlog(t, l, 12)
	o := fixedClock()
	o.budgetWindow = 300 * time.Millisecond
	start := time.Now()
	r := mustRun(t, o, l.args("sweep", "--all", "--batch", "5", "--max-calls", "2")...)
	elapsed := time.Since(start)
	// Batches of 5, 5, 2: the third call waits for the window.
	if !strings.HasPrefix(r.stdout, "Swept 12 rows") || !strings.Contains(r.stdout, "in 3 batches") || !strings.Contains(r.stdout, "waited") {
		t.Errorf("stdout: %q", r.stdout)
	}
	if !regexp.MustCompile(`^d1idem: sweep: waiting \d+ms for the request budget \(2 D1 calls per 300ms, --max-calls\) after 10 rows\n$`).MatchString(r.stderr) {
		t.Errorf("stderr: %q", r.stderr)
	}
	if elapsed < 250*time.Millisecond {
		t.Errorf("3 calls with 2 per 300ms took only %v", elapsed)
	}
}

// TestSweepLocalUnlimited: with --local and no --max-calls there is no
// budget (d1local has no API limit); an explicit one applies.
func TestSweepLocalUnlimited(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir)
	r := mustRun(t, nil, "sweep", "--local", dir, "--all", "--json", "--max-calls", "0")
	if !strings.Contains(r.stdout, `"deleted": 0`) {
		t.Errorf("%s", r)
	}
	o := &options{budgetWindow: 200 * time.Millisecond}
	r = mustRun(t, o, "sweep", "--local", dir, "--max-calls", "1", "--dry-run")
	if !strings.HasPrefix(r.stdout, "Dry run: 0 rows") {
		t.Errorf("%s", r)
	}
}

// TestSweepProgress: on a terminal the sweep counts the backlog first and
// redraws a progress line.
func TestSweepProgress(t *testing.T) {
	l := newSchemaDB(t, "ops")
	backlog(t, l, 45)
	o := fixedClock()
	o.isTerminal = func(io.Writer) bool { return true }
	r := mustRun(t, o, l.args("sweep", "--all", "--batch", "10")...)
	for _, want := range []string{
		"\r\033[Kswept 10 [#####...................] of ~45 (22%) rows, 1 batch, ",
		"\r\033[Kswept 45 [########################] of ~45 (100%) rows, 5 batches, ",
		"\nSwept 45 rows last updated more than 24h ago in 5 batches of at most 10 (6 D1 calls, ",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in %q", want, r.stdout)
		}
	}
	// Not a terminal: one summary line, no carriage returns.
	backlog2 := newSchemaDB(t, "ops2")
	backlog(t, backlog2, 15)
	r = mustRun(t, fixedClock(), backlog2.args("sweep", "--all", "--batch", "10")...)
	if strings.Contains(r.stdout, "\r") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("not a terminal: %q", r.stdout)
	}
}
