package d1local

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadDatabaseFile: a database whose file is not SQLite, or whose first
// page is corrupt, is answered at once as D1 answers an SQLite error (400,
// code 7500, "result": [], a message ending ": SQLITE_<CODE>"), which
// clients do not retry, naming the file but not its directory; the file is
// left as it was, and the other databases of the directory still work.
func TestBadDatabaseFile(t *testing.T) {
	dir := t.TempDir()
	good := newHarness(t, Config{Dir: dir})
	good.exec(t, "corrupt", "CREATE TABLE t (x)", "INSERT INTO t VALUES (1)")
	if err := good.srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Keep page 1's header, garble the rest of the page (the schema).
	corrupt, err := os.ReadFile(filepath.Join(dir, "corrupt.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int(binary.BigEndian.Uint16(corrupt[16:18]))
	for i := 100; i < pageSize; i++ {
		corrupt[i] = 0xab
	}
	files := map[string][]byte{
		"garbage": []byte("garbage\n"),
		"corrupt": corrupt,
	}
	for id, data := range files {
		if err := os.WriteFile(filepath.Join(dir, id+".sqlite"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"garbage": "garbage.sqlite is not a SQLite database: SQLITE_NOTADB",
		"corrupt": "corrupt.sqlite is corrupt (database disk image is malformed): SQLITE_CORRUPT",
	}

	for _, noAutoCreate := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoAutoCreate=%v", noAutoCreate), func(t *testing.T) {
			h := newHarness(t, Config{Dir: dir, NoAutoCreate: noAutoCreate})
			for id, msg := range want {
				for _, endpoint := range []string{"query", "raw"} {
					r := h.post(t, id, endpoint, q("SELECT 1"))
					checkError(t, r, 400, 7500)
					if got := r.env.Errors[0].Message; got != msg {
						t.Errorf("%s /%s: message %q, want %q", id, endpoint, got, msg)
					}
					if string(r.env.Result) != "[]" {
						t.Errorf("%s /%s: result = %s, want []", id, endpoint, r.env.Result)
					}
					if strings.Contains(string(r.body), dir) {
						t.Errorf("%s /%s: the answer shows the directory: %s", id, endpoint, r.body)
					}
				}
				err := h.srv.CreateDatabase(id)
				var se *sqlError
				if !errors.As(err, &se) || se.msg != msg {
					t.Errorf("CreateDatabase(%s) = %v, want an SQL error %q", id, err, msg)
				}
			}
			h.exec(t, "fine", "CREATE TABLE IF NOT EXISTS t (x)", "INSERT INTO t VALUES (1)")
		})
	}

	for id, data := range files {
		path := filepath.Join(dir, id+".sqlite")
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s changed (err %v): %d bytes, want %d", path, err, len(got), len(data))
		}
		for _, suffix := range []string{"-wal", "-shm", "-journal"} {
			if _, err := os.Stat(path + suffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s%s exists (err %v)", path, suffix, err)
			}
		}
	}
	h := newHarness(t, Config{Dir: dir})
	if got := h.rows(t, "fine", q("SELECT count(*) AS n FROM t")); got != `[{"n":2}]` {
		t.Errorf("the good database: %s", got)
	}
}

// TestOpenConnErrorNamesBaseName: openConn's error names the file by its
// base name, never its directory.
func TestOpenConnErrorNamesBaseName(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := openConn(filepath.Join(dir, "x.sqlite"))
	if err == nil || strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "open x.sqlite: ") {
		t.Errorf("openConn in a missing directory: %v, want an error naming x.sqlite alone", err)
	}
}
