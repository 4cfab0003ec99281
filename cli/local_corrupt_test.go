package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalNotADatabase: a --local directory whose database file is not
// SQLite fails the command at once, in one line naming the file, with no
// retry and without touching the file; another database of the directory
// still works.
func TestLocalNotADatabase(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "schema", "apply", "--local", dir, "--database-id", "other")
	path := filepath.Join(dir, "d1idem.sqlite")
	garbage := []byte("garbage\n")
	if err := os.WriteFile(path, garbage, 0o644); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, nil, "stats", "--local", dir)
	if r.code != exitError {
		t.Fatalf("stats --local on a garbage file: %s", r)
	}
	line, rest, _ := strings.Cut(r.stderr, "\n")
	if rest != "" || !strings.Contains(line, "d1idem.sqlite is not a SQLite database") || !strings.Contains(line, "SQLITE_NOTADB") {
		t.Errorf("stderr is not one line naming the file: %s", r)
	}
	for _, bad := range []string{"transient", "attempts", "internal error"} {
		if strings.Contains(line, bad) {
			t.Errorf("stderr says %q: %s", bad, r)
		}
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != string(garbage) {
		t.Errorf("d1idem.sqlite changed: %q, %v", got, err)
	}

	mustRun(t, nil, "stats", "--local", dir, "--database-id", "other")
}
