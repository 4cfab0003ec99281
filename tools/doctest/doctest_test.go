package doctest

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// root is the module's root, from this package's directory.
const root = "../.."

// needGo skips the test when the go command is missing, except in CI.
func needGo(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the go command is needed in CI: %v", err)
		}
		t.Skipf("the go command is not in PATH: %v", err)
	}
}

// moduleFiles returns the module's files with the extension ext, relative
// to root, leaving out node_modules and hidden directories.
func moduleFiles(t *testing.T, ext string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == "node_modules" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ext) {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every Go block of every Markdown file of the module compiles against the
// module's packages as they are.
func TestMarkdownGoBlocksCompile(t *testing.T) {
	needGo(t)
	var blocks []Block
	for _, md := range moduleFiles(t, ".md") {
		bs, err := Blocks(md, read(t, md))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
	}
	if !containsFile(blocks, "README.md") {
		t.Fatal("the check is broken: no Go block found in README.md")
	}
	if err := Check(root, blocks); err != nil {
		t.Errorf("Go blocks of the Markdown files do not compile (see tools/doctest for how blocks are compiled):\n%v", err)
	}
}

func containsFile(blocks []Block, file string) bool {
	for _, b := range blocks {
		if b.File == file {
			return true
		}
	}
	return false
}

// Every link of a Markdown file into the module, and every reference such
// as docs/contract.md#5-fencing in a Go comment, points at a file that
// exists and, for a Markdown file, at one of its headings.
func TestDocLinksResolve(t *testing.T) {
	var links []Link
	for _, md := range moduleFiles(t, ".md") {
		for _, l := range MarkdownLinks(md, read(t, md)) {
			if l.Target == "" {
				l.Target = md
			}
			links = append(links, l)
		}
	}
	for _, src := range moduleFiles(t, ".go") {
		links = append(links, GoLinks(src, read(t, src))...)
	}
	anchors := map[string]map[string]bool{}
	checked := 0
	for _, l := range links {
		target := filepath.Join(root, filepath.FromSlash(l.Target))
		if _, err := os.Stat(target); err != nil {
			t.Errorf("%s: link to %s: no such file", l.From, l.Target)
			continue
		}
		if l.Anchor == "" || !strings.HasSuffix(l.Target, ".md") {
			continue
		}
		if anchors[l.Target] == nil {
			anchors[l.Target] = Anchors(read(t, l.Target))
		}
		if !anchors[l.Target][l.Anchor] {
			t.Errorf("%s: link to %s#%s: no such heading", l.From, l.Target, l.Anchor)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("the check is broken: no link to a heading found")
	}
}

func TestCheckReportsAtMarkdownPositions(t *testing.T) {
	needGo(t)
	md := "# Doc\n\n" +
		"```go\n" +
		"n := strings.Count(\"a\", 1)\n" + // line 4: a type error
		"_ = n\n" +
		"```\n\n" +
		"```go\n" +
		"v, err := strconv.Atoi(\"1\")\n" + // line 9: strconv is not in Packages, and v is unused
		"return err\n" +
		"```\n\n" +
		"<!-- doctest: skip shows a mistake on purpose -->\n" +
		"```go\n" +
		"this is not Go\n" +
		"```\n"
	blocks, err := Blocks("doc.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 3 || blocks[2].Skip != "shows a mistake on purpose" {
		t.Fatalf("blocks = %+v", blocks)
	}
	err = Check(root, blocks)
	if err == nil {
		t.Fatal("Check accepted blocks that do not compile")
	}
	for _, want := range []string{"doc.md:4:", "doc.md:9:", "undefined: strconv", "declared and not used: v"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the errors do not mention %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "this is not Go") || strings.Contains(err.Error(), "doc.md:14") {
		t.Errorf("a skipped block was compiled:\n%v", err)
	}
}

// Fragments of one file share a package and the prelude; a complete file
// stands alone; "..." lines are elided.
func TestCheckCompilesFragmentsTogether(t *testing.T) {
	needGo(t)
	md := "```go\n" +
		"mux.Handle(\"POST /v1/things\", http.HandlerFunc(create))\n" + // uses the prelude's mux and the next block's create
		"```\n" +
		"```go\n" +
		"func create(w http.ResponseWriter, r *http.Request) {\n" +
		"\tname, err := accountFromSession(r)\n" +
		"\t...\n" +
		"\t_, _ = name, err\n" +
		"}\n" +
		"```\n" +
		"  ```go\n" + // an indented fence
		"  package main\n" +
		"\n" +
		"  import \"fmt\"\n" +
		"\n" +
		"  func main() { fmt.Println(create) }\n" + // create is not visible here
		"  ```\n"
	blocks, err := Blocks("doc.md", []byte(md))
	if err != nil {
		t.Fatal(err)
	}
	err = Check(root, blocks[:2])
	if err != nil {
		t.Fatalf("fragments that compile together were refused:\n%v", err)
	}
	err = Check(root, blocks)
	if err == nil || !strings.Contains(err.Error(), "doc.md:16:") || !strings.Contains(err.Error(), "undefined: create") {
		t.Fatalf("a complete file saw another block's declaration; err = %v", err)
	}
}

func TestBlocksRefusesBadMarkup(t *testing.T) {
	for name, md := range map[string]string{
		"unterminated":   "```go\nx := 1\n",
		"skip no reason": "<!-- doctest: skip -->\n```go\nx\n```\n",
		"skip no block":  "<!-- doctest: skip old API -->\n\nsome text\n\n```go\nx\n```\n",
		"skip on sh":     "<!-- doctest: skip a shell block -->\n```sh\nls\n```\n",
	} {
		if _, err := Blocks("doc.md", []byte(md)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"5. Fencing":                                    "5-fencing",
		"10. Errors":                                    "10-errors",
		"Operators: a key is stuck, what to do":         "operators-a-key-is-stuck-what-to-do",
		"Cost: D1 calls and the API budget":             "cost-d1-calls-and-the-api-budget",
		"Streaming, hijacking, panics and status codes": "streaming-hijacking-panics-and-status-codes",
		"The `d1idem` CLI ##":                           "the-d1idem-cli",
		"See [the contract](docs/contract.md) for_this": "see-the-contract-for_this",
	} {
		if got := Slug(heading); got != want {
			t.Errorf("Slug(%q) = %q, want %q", heading, got, want)
		}
	}
	a := Anchors([]byte("# A\n## A\n```sh\n# not a heading\n```\n<a id=\"x-1\"></a>\n#not a heading\n"))
	for _, want := range []string{"a", "a-1", "x-1"} {
		if !a[want] {
			t.Errorf("Anchors lacks %q: %v", want, a)
		}
	}
	if a["not-a-heading"] || a["nota-heading"] {
		t.Errorf("Anchors took a code line or a non-heading: %v", a)
	}
}

// Every pipe table of the module's Markdown files has a delimiter row under
// its header and as many cells in each row as in its header.
func TestMarkdownTablesWellFormed(t *testing.T) {
	tables := 0
	for _, md := range moduleFiles(t, ".md") {
		text := read(t, md)
		for _, p := range TableProblems(md, text) {
			t.Error(p)
		}
		tables += strings.Count(string(text), "\n|---")
	}
	if tables == 0 {
		t.Fatal("the check is broken: no table found")
	}
}

func TestTableProblems(t *testing.T) {
	md := "# Doc\n\n" +
		"| Field | Default | |\n" + // 3: the header of an older version, left above
		"|---|---|---|\n" +
		"| Field | Default | Accepted | |\n" + // 5
		"|---|---|---|---|\n" + // 6
		"| `TTL` | 30 s | 10 ms - 24 h | lifetime |\n" + // 7
		"\n" +
		"| a | b |\n" + // 9
		"| 1 | 2 |\n" + // 10: no delimiter row
		"\n" +
		"| a | `x \\| y` |\n" + // 12: an escaped pipe is content
		"|:--|--:|\n" +
		"| 1 | 2 |\n" +
		"| 1 |\n" + // 15
		"\n" +
		"```\n| not | a | table |\n|---|\n```\n" +
		"| a |\n" // 21: a header at the end, nothing under it
	got := TableProblems("doc.md", []byte(md))
	want := []string{
		"doc.md:5: a row of 4 cells in a table of 3",
		"doc.md:6: a second delimiter row: a row of dashes, or the header of another table written twice",
		"doc.md:7: a row of 4 cells in a table of 3",
		"doc.md:9: a table's header without a delimiter row (|---|) under it",
		"doc.md:15: a row of 1 cells in a table of 2",
		"doc.md:21: a table's header without a delimiter row (|---|) under it",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
