package d1test

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

func TestForEachBackends(t *testing.T) {
	var names []string
	ForEach(t, func(t *testing.T, b *Backend) {
		names = append(names, b.Name)
		if (b.Name == NameLocal) != (b.Local != nil) {
			t.Errorf("%s backend: Local = %v", b.Name, b.Local)
		}
		c := b.NewClientSchema(t)
		res, err := c.Query(t.Context(), "SELECT count(*) AS n FROM idempotency_keys")
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.Rows[0][0].Int64(); n != 0 {
			t.Errorf("a fresh database holds %d rows", n)
		}
	})
	if len(names) == 0 {
		t.Errorf("ForEach ran no backend")
	}
}

// TestFreshDatabases: each NewClient gets its own empty database.
func TestFreshDatabases(t *testing.T) {
	ForEach(t, func(t *testing.T, b *Backend) {
		d1, d2 := b.NewDatabase(t), b.NewDatabase(t)
		if d1.ID == d2.ID {
			t.Fatalf("two databases share ID %s", d1.ID)
		}
		c1, c2 := d1.Client(t), d2.Client(t)
		if _, err := c1.Query(t.Context(), "CREATE TABLE only_in_one (x)"); err != nil {
			t.Fatal(err)
		}
		if _, err := c2.Query(t.Context(), "SELECT * FROM only_in_one"); err == nil {
			t.Errorf("database %s sees a table of database %s", d2.ID, d1.ID)
		}
		res := d1.Post(t, "raw", `{"sql":"SELECT 1 AS one"}`)
		if res.Status != 200 || !bytes.Contains(res.Body, []byte(`"columns":["one"]`)) {
			t.Errorf("POST raw: HTTP %d %s", res.Status, res.Body)
		}
	})
}

// TestWorkerdWipe: a recycled pool database comes back empty.
func TestWorkerdWipe(t *testing.T) {
	b := Workerd(t)
	db := b.NewDatabase(t)
	c := db.Client(t)
	_, err := c.Exec(t.Context(), []d1client.Statement{
		{SQL: "CREATE TABLE parent (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)"},
		{SQL: "CREATE TABLE child (id INTEGER PRIMARY KEY, p INTEGER REFERENCES parent(id))"},
		{SQL: "CREATE INDEX child_p ON child (p)"},
		{SQL: "CREATE VIEW pv AS SELECT * FROM parent"},
		{SQL: "CREATE TRIGGER pt AFTER INSERT ON parent BEGIN INSERT INTO child (p) VALUES (new.id); END"},
		{SQL: "CREATE VIRTUAL TABLE docs USING fts5(body)"},
		{SQL: "INSERT INTO parent (v) VALUES ('a'), ('b')"},
		{SQL: "INSERT INTO docs (body) VALUES ('hello world')"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := workerd.proc.wipe(db.ID); err != nil {
		t.Fatalf("wipe: %v", err)
	}
	res, err := c.Query(t.Context(), "SELECT type, name FROM sqlite_master WHERE name NOT LIKE '\\_cf\\_%' ESCAPE '\\' AND name != 'sqlite_sequence'")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 0 {
		t.Errorf("after wipe: %v", res.Rows)
	}
	if _, err := c.Query(t.Context(), "CREATE TABLE parent (x)"); err != nil {
		t.Errorf("re-creating a table after the wipe: %v", err)
	}
}

// TestWorkerdUnavailable runs this test binary again with the conformance
// directory pointing at an empty one: outside CI the workerd leg skips (and
// the d1local leg is unaffected), in CI it fails with a clear message.
func TestWorkerdUnavailable(t *testing.T) {
	if os.Getenv("D1TEST_HELPER") == "missing" {
		Workerd(t)
		t.Log("REACHED: Workerd returned")
		return
	}
	if testing.Short() {
		t.Skip("runs the test binary again")
	}
	run := func(ci string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerdUnavailable$", "-test.v", "-test.count=1")
		cmd.Env = append(filteredEnv(), "D1TEST_HELPER=missing", EnvConformanceDir+"="+t.TempDir(), "CI="+ci)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	if err != nil || !strings.Contains(out, "--- SKIP") || !strings.Contains(out, "workerd leg skipped:") || !strings.Contains(out, "run `make test` with Node 20 and npm") || strings.Contains(out, "REACHED") {
		t.Errorf("outside CI: want a skip, got err %v:\n%s", err, out)
	}
	out, err = run("true")
	if err == nil || !strings.Contains(out, "--- FAIL") || !strings.Contains(out, "workerd leg cannot run in CI") || strings.Contains(out, "REACHED") {
		t.Errorf("in CI: want a failure, got err %v:\n%s", err, out)
	}
}

// TestWorkerdDiesWithParent: when the process that started server.mjs dies
// without cleaning up (here: os.Exit), server.mjs and workerd exit too, and
// leave nothing in their temporary directory.
func TestWorkerdDiesWithParent(t *testing.T) {
	if os.Getenv("D1TEST_HELPER") == "orphan" {
		Workerd(t)
		p := workerd.proc.cmd.Process.Pid
		fmt.Printf("PIDS %d %s\n", p, childPIDs(p))
		os.Exit(0) // no cleanup, no Kill: the stdin pipe closes with the process
	}
	if testing.Short() {
		t.Skip("starts a second workerd")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	Workerd(t) // skips when the leg cannot run
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerdDiesWithParent$", "-test.count=1")
	scratch := t.TempDir() // the orphan's temporary directory
	cmd.Env = append(filteredEnv(), "D1TEST_HELPER=orphan", "TMPDIR="+scratch)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var pids []int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
			for _, f := range strings.Fields(rest) {
				n, _ := strconv.Atoi(f)
				pids = append(pids, n)
			}
		}
	}
	if len(pids) < 2 {
		t.Fatalf("helper reported no node and workerd PIDs:\n%s", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still running 10 s after its parent exited", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	assertEmptyDir(t, scratch)
}

// assertEmptyDir fails t unless dir is empty: a server.mjs that exited
// left nothing in its temporary directory.
func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("server.mjs left %s in its temporary directory", e.Name())
	}
}

// filteredEnv is the environment without the variables that steer the
// workerd leg.
func filteredEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case EnvWorkerdURL, EnvConformanceDir, "CI", "D1TEST_HELPER":
		default:
			env = append(env, kv)
		}
	}
	return env
}

// childPIDs lists the direct children of pid (workerd, for server.mjs).
func childPIDs(pid int) string {
	var out []string
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		out = append(out, strings.Fields(string(data))...)
	}
	return strings.Join(out, " ")
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// TestBridgeBackends: the workerd backend sends the bridge's secret (a
// client without it is refused), and a Bridge of a test's own has an admin
// bridge on the same databases and is gone, workerd included, when its test
// ends, leaving nothing in its temporary directory.
func TestBridgeBackends(t *testing.T) {
	b := Workerd(t)
	if len(b.Token) < 16 {
		t.Fatalf("the workerd backend has no secret")
	}
	res := b.NewDatabase(t).PostHeader(t, "raw", http.Header{}, `{"sql":"SELECT 1"}`)
	if res.Status != http.StatusUnauthorized {
		t.Errorf("without the token: HTTP %d %s", res.Status, res.Body)
	}
	if testing.Short() {
		t.Skip("starts a second workerd")
	}
	var pids []int
	scratch := t.TempDir() // the own bridge's temporary directory
	t.Run("own bridge", func(t *testing.T) {
		own := Bridge(t, BridgeConfig{Mode: "ledger-only", Pool: 2, Env: []string{"TMPDIR=" + scratch}})
		db := own.NewDatabase(t)
		if res := db.Post(t, "raw", `{"sql":"CREATE TABLE t (x)"}`); res.Status != http.StatusBadRequest {
			t.Errorf("ledger-only bridge accepted DDL: HTTP %d %s", res.Status, res.Body)
		}
		if _, err := db.Admin(t).Client(t).Query(t.Context(), "CREATE TABLE t (x)"); err != nil {
			t.Errorf("admin bridge: %v", err)
		}
		if _, err := own.Admin.Database(db.ID).Client(t).Query(t.Context(), "SELECT * FROM t"); err != nil {
			t.Errorf("the admin bridge does not see its own table: %v", err)
		}
		p := own.proc
		pids = append(pids, p.cmd.Process.Pid)
		for _, f := range strings.Fields(childPIDs(p.cmd.Process.Pid)) {
			n, _ := strconv.Atoi(f)
			pids = append(pids, n)
		}
	})
	if len(pids) < 2 {
		t.Fatalf("no node and workerd PIDs recorded: %v", pids)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d outlived its test", pid)
		}
	}
	assertEmptyDir(t, scratch)
}
