package doctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's quick start is a whole program: it compiles and runs, and
// prints what the README says it prints (the ```text block after it).
func TestReadmeProgramRuns(t *testing.T) {
	needGo(t)
	md := read(t, "README.md")
	blocks, err := Blocks("README.md", md)
	if err != nil {
		t.Fatal(err)
	}
	var program string
	for _, b := range blocks {
		if startsWithPackage(b.Code) && strings.Contains(b.Code, "func main()") {
			program = b.Code
		}
	}
	if program == "" {
		t.Fatal("README.md has no Go program (a block with package main and func main)")
	}
	m := regexp.MustCompile("(?s)It prints[^\n]*\n\n```text\n(.*?)```").FindSubmatch(md)
	if m == nil {
		t.Fatal("README.md does not say what its program prints (\"It prints\" and a ```text block)")
	}
	// A directory inside the module, so that the program builds against it.
	dir, err := os.MkdirTemp(root, ".readme-program-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run the README's program: %v\n%s", err, out)
	}
	if got, want := string(out), string(m[1]); got != want {
		t.Errorf("the README's program prints\n%s\nthe README says\n%s", got, want)
	}
}
