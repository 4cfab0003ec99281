package d1local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// endless is a query that runs until its request is cancelled.
const endless = `{"sql":"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"}`

// answer is what send got.
type answer struct {
	status int
	body   string
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, a.body)
}

// send makes one request without a testing.T, for use off the test's
// goroutine.
func send(ctx context.Context, url, method, path, body string) answer {
	req, err := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(raw), err: err}
}

// failAfter bounds how long a call that must not wait for a busy database
// may take before the test calls the server frozen. It decides nothing
// when the code is right: every call it bounds answers at once.
const failAfter = 30 * time.Second

// waitUntil polls cond until it holds, failing the test after failAfter.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(failAfter)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// startEndless starts the endless query on db and waits until it holds the
// database. Cancel stops it; its answer (a transport error) arrives on the
// channel.
func startEndless(t *testing.T, h *harness, db string) (cancel func(), done <-chan answer) {
	t.Helper()
	h.srv.mu.Lock()
	d := h.srv.dbs[db]
	h.srv.mu.Unlock()
	if d == nil {
		t.Fatalf("database %s is not open", db)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan answer, 1)
	go func() { ch <- send(ctx, h.url, "POST", "/accounts/acc/d1/database/"+db+"/query", endless) }()
	waitUntil(t, "the endless query holds "+db, func() bool {
		select {
		case a := <-ch:
			t.Fatalf("the endless query answered: %v", a)
		default:
		}
		return len(d.lock) == 1
	})
	return cancel, ch
}

// pending fails the test if ch has delivered.
func pending(t *testing.T, what string, ch <-chan answer) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s finished while the endless query ran: %v", what, a)
	default:
	}
}

// TestDeleteBusyDatabase: deleting a database whose request is running
// waits for that request, but holds up nothing else: calls to other
// databases, list, get and create answer while it runs, and the database
// is already absent to them; afterwards its files are gone. A call that
// would create the database waits for the deletion and gets a new, empty
// one (with NoAutoCreate: 404 at once).
func TestDeleteBusyDatabase(t *testing.T) {
	for _, noAutoCreate := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoAutoCreate=%v", noAutoCreate), func(t *testing.T) { deleteBusyDatabase(t, noAutoCreate) })
	}
}

// deleteBusyDatabase is TestDeleteBusyDatabase, with or without
// NoAutoCreate.
func deleteBusyDatabase(t *testing.T, noAutoCreate bool) {
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir, NoAutoCreate: noAutoCreate})
	for _, id := range []string{"slow2", "other"} {
		if err := h.srv.CreateDatabase(id); err != nil {
			t.Fatal(err)
		}
		h.exec(t, id, "CREATE TABLE t (x)", "INSERT INTO t VALUES (1)")
	}
	cancel, long := startEndless(t, h, "slow2")

	del := make(chan answer, 1)
	go func() {
		del <- send(context.Background(), h.url, "DELETE", "/accounts/acc/d1/database/slow2", "")
	}()
	ctx, stop := context.WithTimeout(context.Background(), failAfter)
	defer stop()
	call := func(method, path, body string) answer {
		t.Helper()
		a := send(ctx, h.url, method, "/accounts/acc/d1/database"+path, body)
		if a.err != nil {
			t.Fatalf("%s %s while slow2 is being deleted: %v (the server froze)", method, path, a.err)
		}
		return a
	}
	// Once the deletion has begun, slow2 is absent. (A get of
	// slow2 sent before would wait for the endless query; a list
	// takes no database.)
	for a := call("GET", "", ""); strings.Contains(a.body, `"slow2"`); a = call("GET", "", "") {
		pending(t, "the delete", del)
		time.Sleep(time.Millisecond)
	}
	othersAnswerDuringDelete(t, call)
	again := make(chan answer, 1)
	if noAutoCreate {
		if a := call("POST", "/slow2/query", `{"sql":"SELECT 1"}`); a.status != http.StatusNotFound {
			t.Errorf("query slow2 with NoAutoCreate: %v", a)
		}
	} else {
		go func() {
			again <- send(ctx, h.url, "POST", "/accounts/acc/d1/database/slow2/query", `{"sql":"SELECT count(*) FROM t"}`)
		}()
	}
	pending(t, "the delete", del)
	pending(t, "the endless query", long)

	cancel()
	if a := <-long; a.err == nil {
		t.Errorf("the endless query answered %v", a)
	}
	if a := <-del; a.err != nil || a.status != 200 {
		t.Fatalf("delete slow2: %v", a)
	}
	if noAutoCreate {
		deletedForGood(t, h, dir, call)
	} else {
		// The query waited for the deletion and found a new database.
		a := <-again
		if a.err != nil || a.status != 400 || !strings.Contains(a.body, "no such table: t") {
			t.Errorf("query slow2 made during the delete: %v, want no such table", a)
		}
	}
	if got := h.rows(t, "other", q("SELECT count(*) AS n FROM t")); got != `[{"n":2}]` {
		t.Errorf("other: %s", got)
	}
}

// othersAnswerDuringDelete checks, through call, that while slow2 is
// being deleted it is absent, and that everything else answers: a query
// of another database, list, get, create, and a second delete of slow2.
func othersAnswerDuringDelete(t *testing.T, call func(method, path, body string) answer) {
	t.Helper()
	if a := call("GET", "/slow2", ""); a.status != http.StatusNotFound {
		t.Errorf("get slow2: %v", a)
	}
	if a := call("POST", "/other/query", `{"sql":"INSERT INTO t VALUES (2)"}`); a.status != 200 {
		t.Errorf("query other: %v", a)
	}
	if a := call("GET", "", ""); a.status != 200 || strings.Contains(a.body, "slow2") || !strings.Contains(a.body, `"other"`) {
		t.Errorf("list: %v", a)
	}
	if a := call("GET", "/other", ""); a.status != 200 {
		t.Errorf("get other: %v", a)
	}
	if a := call("POST", "", `{"name":"fresh"}`); a.status != 200 {
		t.Errorf("create fresh: %v", a)
	}
	if a := call("DELETE", "/slow2", ""); a.status != http.StatusNotFound {
		t.Errorf("second delete of slow2: %v", a)
	}
}

// deletedForGood checks, with NoAutoCreate, that slow2 stays deleted: a
// get is 404, it is not listed, and none of its files is left in dir.
func deletedForGood(t *testing.T, h *harness, dir string, call func(method, path, body string) answer) {
	t.Helper()
	if a := call("GET", "/slow2", ""); a.status != http.StatusNotFound {
		t.Errorf("get slow2 after the delete: %v", a)
	}
	if ids, err := h.srv.Databases(); err != nil || strings.Join(ids, ",") != "fresh,other" {
		t.Errorf("Databases() = %v, %v", ids, err)
	}
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if _, err := os.Stat(filepath.Join(dir, "slow2.sqlite"+suffix)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("slow2.sqlite%s exists after the delete (%v)", suffix, err)
		}
	}
}

// openFDs counts this process's file descriptors open on files in dir
// (-1 where /proc/self/fd cannot be read).
func openFDs(dir string) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			n++
		}
	}
	return n
}

// TestManyDatabasesBoundedOpenFiles: with MaxOpenDatabases 4, fifty
// databases used round-robin each keep every write across the closing and
// reopening of their files, while at most 4 are open at once (and the
// process holds at most 3 descriptors each); a database closed while idle
// has its WAL checkpointed into the file.
func TestManyDatabasesBoundedOpenFiles(t *testing.T) {
	const bound, n, rounds = 4, 50, 3
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir, MaxOpenDatabases: bound})
	id := func(i int) string { return fmt.Sprintf("db%02d", i) }
	for r := range rounds {
		for i := range n {
			if r == 0 {
				h.exec(t, id(i), "CREATE TABLE t (round INTEGER, db TEXT)")
			}
			h.ok(t, id(i), q("INSERT INTO t VALUES (?, ?)", r, id(i)))
			want := fmt.Sprintf(`[{"n":%d,"s":%d}]`, r+1, r*(r+1)/2)
			if got := h.rows(t, id(i), q("SELECT count(*) AS n, sum(round) AS s FROM t WHERE db = ?", id(i))); got != want {
				t.Fatalf("round %d, %s: %s, want %s", r, id(i), got, want)
			}
			if open := h.srv.openFiles(); open > bound {
				t.Fatalf("round %d, %s: %d files open; the bound is %d", r, id(i), open, bound)
			}
			// Had it opened past the bound (no idle one closed first), its
			// release would have closed it.
			if !h.srv.isOpen(t, id(i)) {
				t.Fatalf("round %d, %s: closed after its call, so it opened past the bound", r, id(i))
			}
			if fds := openFDs(dir); fds > 3*bound {
				t.Fatalf("round %d, %s: %d descriptors open in the directory, over %d", r, id(i), fds, 3*bound)
			}
		}
	}
	// All but the last few used were closed, their WAL checkpointed.
	for i := range n - bound {
		if _, err := os.Stat(filepath.Join(dir, id(i)+".sqlite-wal")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, closed, still has a WAL (%v)", id(i), err)
		}
	}
	if ids, err := h.srv.Databases(); err != nil || len(ids) != n {
		t.Errorf("Databases() = %d IDs, %v; want %d", len(ids), err, n)
	}
	// The get endpoint and export reopen a closed database too.
	if r := h.do(t, "GET", "/accounts/acc/d1/database/"+id(0), nil); r.status != 200 || !strings.Contains(string(r.body), `"num_tables":1`) {
		t.Errorf("get %s: %d %s", id(0), r.status, r.body)
	}
	if r := h.post(t, id(1), "export", `{"output_format":"polling"}`); r.status != 200 {
		t.Errorf("export %s: %d %s", id(1), r.status, r.body)
	}
	if err := h.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if open := h.srv.openFiles(); open != 0 {
		t.Errorf("%d files open after Close", open)
	}
	if fds := openFDs(dir); fds > 0 {
		t.Errorf("%d descriptors open in the directory after Close", fds)
	}
	h2 := newHarness(t, Config{Dir: dir, MaxOpenDatabases: bound})
	for i := range n {
		if got := h2.rows(t, id(i), q("SELECT count(*) AS n FROM t")); got != fmt.Sprintf(`[{"n":%d}]`, rounds) {
			t.Errorf("%s after a restart: %s", id(i), got)
		}
	}
}

// TestBusyDatabaseIsNeverClosed: a database in use is not closed to make
// room; with every open one in use, another opens past the bound and is
// closed when its call ends.
func TestBusyDatabaseIsNeverClosed(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir, MaxOpenDatabases: 1})
	h.exec(t, "busy", "CREATE TABLE t (x)", "INSERT INTO t VALUES (1)")
	cancel, long := startEndless(t, h, "busy")
	for _, id := range []string{"b", "c", "b"} {
		h.exec(t, id, "CREATE TABLE IF NOT EXISTS t (x)", "INSERT INTO t VALUES (1)")
		// It opened past the bound and closed once its call ended.
		if open := h.srv.openFiles(); open != 1 || h.srv.isOpen(t, id) {
			t.Errorf("after a call to %s: %d open, it open %v; want 1, the busy one", id, open, h.srv.isOpen(t, id))
		}
	}
	pending(t, "the endless query", long)
	cancel()
	if a := <-long; a.err == nil {
		t.Errorf("the endless query answered %v", a)
	}
	for id, want := range map[string]string{"busy": `[{"n":1}]`, "b": `[{"n":2}]`, "c": `[{"n":1}]`} {
		if got := h.rows(t, id, q("SELECT count(*) AS n FROM t")); got != want {
			t.Errorf("%s: %s, want %s", id, got, want)
		}
		if open := h.srv.openFiles(); open != 1 {
			t.Errorf("after reading %s: %d open, want 1", id, open)
		}
	}
}

// TestOpeningHoldsUpNothingElse: while a database's file is slow to open
// (another process holds it locked, so setting it up waits), calls to
// other databases, list and create answer; the waiting call succeeds once
// the lock is gone.
func TestOpeningHoldsUpNothingElse(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir})
	h.exec(t, "other", "CREATE TABLE t (x)")
	c, err := openConn(filepath.Join(dir, "locked.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if err := c.exec("CREATE TABLE t (x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	slow := make(chan answer, 1)
	go func() {
		slow <- send(context.Background(), h.url, "POST", "/accounts/acc/d1/database/locked/query", `{"sql":"SELECT count(*) AS n FROM t"}`)
	}()
	waitUntil(t, "locked is being opened", func() bool {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		return h.srv.dbs["locked"] != nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), busyTimeoutMsec*time.Millisecond/2)
	defer cancel()
	for _, call := range []struct{ method, path, body string }{
		{"POST", "/other/query", `{"sql":"INSERT INTO t VALUES (1)"}`},
		{"GET", "", ""},
		{"POST", "", `{"name":"fresh"}`},
	} {
		if a := send(ctx, h.url, call.method, "/accounts/acc/d1/database"+call.path, call.body); a.err != nil || a.status != 200 {
			t.Errorf("%s %s while locked was opening: %v", call.method, call.path, a)
		}
	}
	select {
	case a := <-slow:
		t.Fatalf("the call to locked answered while the file was locked: %v", a)
	default:
	}
	if err := c.exec("ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if a := <-slow; a.err != nil || a.status != 200 || !strings.Contains(a.body, `"n":0`) {
		t.Errorf("the call to locked: %v", a)
	}
}

// TestLeastRecentlyUsedIsClosed: the database closed to make room is the
// idle one used least recently, not the one opened first.
func TestLeastRecentlyUsedIsClosed(t *testing.T) {
	h := newHarness(t, Config{Dir: t.TempDir(), MaxOpenDatabases: 2})
	for _, id := range []string{"a", "b", "a", "c"} {
		h.ok(t, id, q("SELECT 1"))
	}
	for id, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if got := h.srv.isOpen(t, id); got != want {
			t.Errorf("%s open: %v, want %v", id, got, want)
		}
	}
	if open := h.srv.openFiles(); open != 2 {
		t.Errorf("%d files open, want 2", open)
	}
}

// TestFailedReopen: a database closed while idle whose file has since
// become garbage answers each call at once with the bad file's 400, and
// stays held by none of them.
func TestFailedReopen(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, Config{Dir: dir, MaxOpenDatabases: 1})
	h.exec(t, "x", "CREATE TABLE t (v)")
	h.exec(t, "y", "CREATE TABLE t (v)")
	if h.srv.isOpen(t, "x") {
		t.Fatal("x is still open")
	}
	path := filepath.Join(dir, "x.sqlite")
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	const want = `"x.sqlite is not a SQLite database: SQLITE_NOTADB"`
	for i := range 2 {
		a := send(ctx, h.url, "POST", "/accounts/acc/d1/database/x/query", `{"sql":"SELECT 1"}`)
		if a.err != nil || a.status != 400 || !strings.Contains(a.body, want) {
			t.Fatalf("call %d to x: %v, want 400 with %s", i+1, a, want)
		}
	}
	// y was closed to make room; x's failed openings count nothing.
	if open := h.srv.openFiles(); open != 0 {
		t.Errorf("%d files open, want 0", open)
	}
	h.ok(t, "y", q("SELECT count(*) FROM t"))
}

// TestNegativeMaxOpenDatabases: a negative MaxOpenDatabases is no bound;
// more databases than DefaultMaxOpenDatabases stay open.
func TestNegativeMaxOpenDatabases(t *testing.T) {
	const n = DefaultMaxOpenDatabases + 2
	h := newHarness(t, Config{Dir: t.TempDir(), MaxOpenDatabases: -1})
	for i := range n {
		if err := h.srv.CreateDatabase(fmt.Sprintf("db%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	h.ok(t, "db000", q("SELECT 1"))
	if open := h.srv.openFiles(); open != n {
		t.Errorf("%d files open, want %d", open, n)
	}
	if !h.srv.isOpen(t, "db000") {
		t.Error("the first database was closed")
	}
}

// TestOpenFailureHidesDirectory: a database file that cannot be opened is
// an internal error naming the file, not the directory.
func TestOpenFailureHidesDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "dir.sqlite"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, Config{Dir: dir})
	r := h.post(t, "dir", "query", q("SELECT 1"))
	checkError(t, r, http.StatusInternalServerError, 7500)
	if msg := r.env.Errors[0].Message; strings.Contains(msg, dir) || !strings.Contains(msg, "dir.sqlite") {
		t.Errorf("message %q: want dir.sqlite named without %s", msg, dir)
	}
}

// TestLifecycleRace: many goroutines query, create, get, list and delete
// overlapping databases, with few files allowed open. Every call answers
// as D1 could (200, or 404 for a database deleted under it), and at the
// end the open files are exactly those of the server's databases: none
// was reopened after its deletion.
func TestLifecycleRace(t *testing.T) {
	for _, inMemory := range []bool{false, true} {
		t.Run(fmt.Sprintf("memory=%v", inMemory), func(t *testing.T) { lifecycleRace(t, inMemory) })
	}
}

// lifecycleRace is TestLifecycleRace, on files or in memory.
func lifecycleRace(t *testing.T, inMemory bool) {
	cfg := Config{MaxOpenDatabases: 2}
	if !inMemory {
		cfg.Dir = t.TempDir()
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const workers, ops = 12, 150
	var wg sync.WaitGroup
	errs := make(chan string, workers*ops)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lifecycleWorker(srv, rand.New(rand.NewPCG(uint64(w), 1)), ops, errs)
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}

	// Every counted connection belongs to a database in the map.
	srv.mu.Lock()
	dbs := make([]*database, 0, len(srv.dbs))
	for _, d := range srv.dbs {
		dbs = append(dbs, d)
	}
	srv.mu.Unlock()
	live := 0
	for _, d := range dbs {
		d.lock <- struct{}{}
		if d.conn != nil {
			live++
		}
		<-d.lock
	}
	if open := srv.openFiles(); !inMemory && (open != live || open > cfg.MaxOpenDatabases) {
		t.Errorf("%d files counted open, %d databases open; bound %d", open, live, cfg.MaxOpenDatabases)
	}
	if srv.handles != nil && srv.handles.lru.Len() != live {
		t.Errorf("%d databases listed open, %d open", srv.handles.lru.Len(), live)
	}
	deleteEveryDatabase(t, srv, cfg.Dir)
}

// lifecycleWorker sends ops random calls (query, delete, create, get,
// list) on five overlapping databases to srv, and sends to errs each
// answer D1 could not give: anything but 200, or 404 for a database
// deleted under it.
func lifecycleWorker(srv *Server, rng *rand.Rand, ops int, errs chan<- string) {
	ids := []string{"a", "b", "c", "d", "e"}
	for range ops {
		id := ids[rng.IntN(len(ids))]
		var code int
		var body string
		switch op := rng.IntN(10); {
		case op < 5:
			code, body = serveDatabases(srv, "POST", "/"+id+"/query", `{"batch":[`+
				`{"sql":"CREATE TABLE IF NOT EXISTS t (x)"},{"sql":"INSERT INTO t VALUES (1)"},{"sql":"SELECT count(*) FROM t"}]}`)
		case op < 7:
			code, body = serveDatabases(srv, "DELETE", "/"+id, "")
		case op == 7:
			code, body = serveDatabases(srv, "POST", "", `{"name":"`+id+`"}`)
			if code == 400 && strings.Contains(body, `"code":7502`) {
				code = 200 // exists
			}
		case op == 8:
			code, body = serveDatabases(srv, "GET", "/"+id, "")
		default:
			code, body = serveDatabases(srv, "GET", "", "")
		}
		if code != 200 && !(code == 404 && strings.Contains(body, `"code":7404`)) {
			errs <- fmt.Sprintf("%s: %d %s", id, code, body)
		}
	}
}

// serveDatabases serves one call of the database endpoints (path is
// below /accounts/acc/d1/database) in process, and returns its status and
// body.
func serveDatabases(srv *Server, method, path, body string) (int, string) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "/accounts/acc/d1/database"+path, strings.NewReader(body))
	req.Host = "127.0.0.1"
	srv.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// deleteEveryDatabase deletes srv's databases and checks that no file is
// left in dir (when there is one) and none is open: none was reopened
// after its deletion.
func deleteEveryDatabase(t *testing.T, srv *Server, dir string) {
	t.Helper()
	left, err := srv.Databases()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range left {
		if err := srv.DeleteDatabase(id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if dir != "" {
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%d files left after deleting every database: %v", len(entries), entries)
		}
		if open := srv.openFiles(); open != 0 {
			t.Errorf("%d files open after deleting every database", open)
		}
	}
}
