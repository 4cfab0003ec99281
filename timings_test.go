package d1idem_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestFirstHourTimingsScript runs tools/first-hour-timings.sh with its
// stand-ins for the demo and make test: it writes its figures, with the
// commit, between the markers of a Markdown file and leaves the rest of
// the file as it was, and removes what it made; a file without the
// markers is refused and left alone.
func TestFirstHourTimingsScript(t *testing.T) {
	for _, tool := range []string{"bash", "git", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	head, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	tmp := t.TempDir()
	run := func(md string) (string, error) {
		cmd := exec.Command("bash", "tools/first-hour-timings.sh", "--fake", md)
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	md := filepath.Join(t.TempDir(), "README.md")
	const before, after = "# Title\n\nSome text.\n<!-- timings:begin -->\n", "<!-- timings:end -->\nMore text.\n"
	if err := os.WriteFile(md, []byte(before+"the last figures\n"+after), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(md); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	figures, okBefore := strings.CutPrefix(string(got), before)
	figures, okAfter := strings.CutSuffix(figures, after)
	if !okBefore || !okAfter {
		t.Fatalf("the text around the markers changed:\n%s", got)
	}
	want := regexp.MustCompile(`^cold: first output after [0-9.]+ s, demo done in [0-9.]+ s; make test [0-9]+ s \(cold\), [0-9]+ s \(warm\); ` +
		`warm, the demo's first output after [0-9.]+ s, done in [0-9.]+ s\.\nMeasured \(--fake: [^\n]*\) by ` + "`tools/first-hour-timings.sh`" +
		` on \d{4}-\d\d-\d\d, commit ` + strings.TrimSpace(string(head)) + `, [^\n]*\n$`)
	if !want.MatchString(figures) {
		t.Errorf("the figures written:\n%s", figures)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the script left %d entries in TMPDIR", len(left))
	}

	bare := filepath.Join(t.TempDir(), "bare.md")
	if err := os.WriteFile(bare, []byte("# No markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(bare); err == nil || !strings.Contains(out, "needs the lines '<!-- timings:begin -->' and '<!-- timings:end -->'") {
		t.Errorf("a file without the markers: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(bare); string(got) != "# No markers\n" {
		t.Errorf("a file without the markers was changed:\n%s", got)
	}
}
