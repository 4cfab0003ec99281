// Package doctest type-checks the Go code blocks of the repository's
// Markdown files against the module's packages, checks that links to
// headings, from Markdown files and Go comments, resolve, and that the
// Markdown files' tables are well formed. Its tests run these over the whole
// module, so a README snippet that stops compiling fails `go test ./...`.
//
// A ```go block is compiled in one of two ways:
//
//   - A block that starts with a package clause is a complete file: it is
//     type-checked alone, as written.
//   - Any other block is a fragment. A fragment of declarations (funcs,
//     types, vars, consts) is put at the top level of a file; a fragment of
//     statements becomes the body of a function returning error, so it may
//     `return err`. All fragments of one Markdown file share one package,
//     so a README's blocks can use each other's declarations, and share the
//     names a prelude declares (ctx, db, ledger, mux, ...), unless a block
//     declares the same name. Imports are added for the standard and
//     module packages a fragment names.
//
// In a fragment, a line holding only "..." stands for elided code and is
// dropped. A block that must not be compiled is preceded by the comment
// <!-- doctest: skip REASON -->, and the reason is required; use it
// sparingly (a block in another language mislabelled as go, or output).
//
// Errors are reported at the Markdown file's line and column.
package doctest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Block is one fenced Go code block of a Markdown file.
type Block struct {
	File string // the Markdown file, as named to Blocks
	Line int    // the line of the block's first line of code, from 1
	Code string // the code, with the fence's indentation removed
	// Skip is the reason given by a <!-- doctest: skip REASON --> comment
	// right before the block; "" when the block is compiled.
	Skip string
}

const skipMarker = "<!-- doctest: skip"

// Blocks returns the ```go (or ~~~go) blocks of the Markdown text md, named
// file in errors and positions. It fails on an unterminated block and on a
// skip comment without a reason.
func Blocks(file string, md []byte) ([]Block, error) {
	var blocks []Block
	lines := strings.Split(string(md), "\n")
	skip, skipLine := "", 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, skipMarker) {
			skip = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(trimmed, skipMarker), "-->"))
			if skip == "" {
				return nil, fmt.Errorf("%s:%d: a doctest skip comment must give its reason", file, i+1)
			}
			skipLine = i + 1
			continue
		}
		indent, fence, info, ok := openFence(line)
		if !ok {
			if trimmed != "" && skip != "" {
				return nil, fmt.Errorf("%s:%d: the doctest skip comment is not followed by a go block", file, skipLine)
			}
			continue
		}
		start := i + 1
		var code []string
		closed := false
		for i++; i < len(lines); i++ {
			if isCloseFence(lines[i], fence) {
				closed = true
				break
			}
			code = append(code, dedent(lines[i], indent))
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: code block is never closed", file, start)
		}
		lang, _, _ := strings.Cut(info, " ")
		if lang == "go" {
			blocks = append(blocks, Block{File: file, Line: start + 1, Code: strings.Join(code, "\n"), Skip: skip})
		} else if skip != "" {
			return nil, fmt.Errorf("%s:%d: the doctest skip comment is not followed by a go block", file, skipLine)
		}
		skip = ""
	}
	if skip != "" {
		return nil, fmt.Errorf("%s:%d: the doctest skip comment is not followed by a go block", file, skipLine)
	}
	return blocks, nil
}

// openFence reports whether line opens a fenced code block (CommonMark: up
// to three spaces, then three or more backticks or tildes), and returns its
// indentation, its fence and its info string.
func openFence(line string) (indent int, fence, info string, ok bool) {
	indent = len(line) - len(strings.TrimLeft(line, " "))
	if indent > 3 {
		return 0, "", "", false
	}
	rest := line[indent:]
	for _, c := range []string{"`", "~"} {
		n := len(rest) - len(strings.TrimLeft(rest, c))
		if n >= 3 {
			info = strings.TrimSpace(rest[n:])
			if c == "`" && strings.Contains(info, "`") {
				return 0, "", "", false
			}
			return indent, rest[:n], info, true
		}
	}
	return 0, "", "", false
}

func isCloseFence(line, fence string) bool {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 || !strings.HasPrefix(t, fence) {
		return false
	}
	return strings.TrimSpace(strings.TrimLeft(t, fence[:1])) == ""
}

// dedent removes up to n leading spaces, as CommonMark does for the lines
// of a fenced block indented by n.
func dedent(line string, n int) string {
	for i := 0; i < n && strings.HasPrefix(line, " "); i++ {
		line = line[1:]
	}
	return line
}

// packages maps the package names a fragment may use without importing
// them to their import paths.
var packages = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"io":          "io",
	"fs":          "io/fs",
	"json":        "encoding/json",
	"log":         "log",
	"slog":        "log/slog",
	"http":        "net/http",
	"httptest":    "net/http/httptest",
	"os":          "os",
	"strings":     "strings",
	"testing":     "testing",
	"time":        "time",
	"d1idem":      "github.com/d1idem/d1idem",
	"d1client":    "github.com/d1idem/d1idem/d1client",
	"d1local":     "github.com/d1idem/d1idem/d1local",
	"d1localtest": "github.com/d1idem/d1idem/d1local/d1localtest",
	"idem":        "github.com/d1idem/d1idem/idem",
	"idemhttp":    "github.com/d1idem/d1idem/idem/idemhttp",
	"idemclient":  "github.com/d1idem/d1idem/idemclient",
	"schema":      "github.com/d1idem/d1idem/schema",
	"chi":         "github.com/go-chi/chi/v5",
	"d1test":      "github.com/d1idem/d1idem/internal/d1test",
}

// prelude holds, by name, the declarations fragments may use without
// declaring them: what a README assumes its reader has at hand. A Markdown
// file's fragments get those of them they do not declare themselves.
var prelude = map[string]string{
	"ctx":                "var ctx context.Context // the request's, or main's",
	"db":                 "var db *d1client.Client // from d1client.New",
	"ledger":             "var ledger *idem.Ledger // from idem.New",
	"mux":                "var mux *http.ServeMux // the service's router",
	"sku":                "var sku string // a value read from the request",
	"accountFromSession": "func accountFromSession(*http.Request) (string, error) { return \"\", nil }",
	"newOrderID":         "func newOrderID() string { return \"\" }",
	"msg":                "var msg struct{ ID string; Body []byte; Nack func(time.Duration); Ack func(result []byte) } // a queue's message",
	"orderID":            "var orderID string // read from the message",
}

// Check type-checks blocks against the packages of the module in moduleDir
// and returns every error, each at its Markdown position, joined; nil when
// all compile. Skipped blocks are left out. It runs `go list -export` in
// moduleDir to find the compiled form of the packages the blocks import.
func Check(moduleDir string, blocks []Block) error {
	fset := token.NewFileSet()
	var errs []error
	byFile := map[string][]*ast.File{} // the fragments of each Markdown file
	var files []string
	var complete [][]*ast.File
	for _, b := range blocks {
		if b.Skip != "" {
			continue
		}
		f, err := parseBlock(fset, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f.complete {
			complete = append(complete, []*ast.File{f.File})
			continue
		}
		if _, ok := byFile[b.File]; !ok {
			files = append(files, b.File)
		}
		byFile[b.File] = append(byFile[b.File], f.File)
	}
	pkgs := complete
	for _, name := range files {
		frags := byFile[name]
		pre, err := preludeFor(fset, name, frags)
		if err != nil {
			return err
		}
		pkgs = append(pkgs, append(frags, pre))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	var paths []string
	for _, pkg := range pkgs {
		for _, f := range pkg {
			for _, imp := range f.Imports {
				if p := strings.Trim(imp.Path.Value, `"`); !slices.Contains(paths, p) {
					paths = append(paths, p)
				}
			}
		}
	}
	exports, err := exportData(moduleDir, paths)
	if err != nil {
		return err
	}
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok {
				return nil, fmt.Errorf("no export data for %s", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) { errs = append(errs, err) },
	}
	for i, pkg := range pkgs {
		_, _ = conf.Check(fmt.Sprintf("doc%d", i), fset, pkg, nil)
	}
	return errors.Join(errs...)
}

type parsedBlock struct {
	*ast.File
	complete bool // a file of its own, package clause included
}

// parseBlock turns a block into a Go file: as written when it has a package
// clause, else a fragment wrapped as the package doc documents.
func parseBlock(fset *token.FileSet, b Block) (parsedBlock, error) {
	at := fmt.Sprintf("//line %s:%d:1\n", b.File, b.Line)
	if f, err := parser.ParseFile(fset, b.File, at+b.Code, parser.ParseComments); err == nil {
		return parsedBlock{f, true}, nil
	} else if startsWithPackage(b.Code) {
		return parsedBlock{}, err
	}
	code := elide(b.Code)
	// Declarations go at the top level; statements into a function body.
	src := "package doc\n" + at + code + "\n"
	f, declErr := parser.ParseFile(fset, b.File, src, parser.ParseComments)
	if declErr != nil {
		src = "package doc\nfunc _() error {\n" + at + code + "\nreturn nil\n}\n"
		var stmtErr error
		if f, stmtErr = parser.ParseFile(fset, b.File, src, parser.ParseComments); stmtErr != nil {
			return parsedBlock{}, fmt.Errorf("neither declarations nor statements:\n%v\n%v", declErr, stmtErr)
		}
	}
	// Import the packages the fragment names but does not declare.
	var imports []string
	for _, id := range f.Unresolved {
		if path, ok := packages[id.Name]; ok && !slices.Contains(imports, path) {
			imports = append(imports, path)
		}
	}
	if len(imports) == 0 {
		return parsedBlock{f, false}, nil
	}
	slices.Sort(imports)
	var decl strings.Builder
	decl.WriteString("package doc\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&decl, "\t%q\n", p)
	}
	decl.WriteString(")\n")
	f, err := parser.ParseFile(fset, b.File, decl.String()+strings.TrimPrefix(src, "package doc\n"), parser.ParseComments)
	return parsedBlock{f, false}, err
}

func startsWithPackage(code string) bool {
	s := bufio.NewScanner(strings.NewReader(code))
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "package ")
	}
	return false
}

// elide blanks the lines that hold only "...", keeping the line count.
func elide(code string) string {
	lines := strings.Split(code, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) == "..." {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// preludeFor returns the prelude's declarations of the names the fragments
// of mdFile do not declare at top level, as a file of their package.
func preludeFor(fset *token.FileSet, mdFile string, frags []*ast.File) (*ast.File, error) {
	var names []string
	for name := range prelude {
		if !slices.ContainsFunc(frags, func(f *ast.File) bool { return f.Scope.Lookup(name) != nil }) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var code strings.Builder
	for _, name := range names {
		code.WriteString(prelude[name] + "\n")
	}
	f, err := parseBlock(fset, Block{File: mdFile + " (doctest prelude)", Line: 1, Code: code.String()})
	if err != nil {
		return nil, fmt.Errorf("doctest: the prelude: %w", err)
	}
	return f.File, nil
}

// exportData returns the files of compiler export data for the packages
// paths, from `go list -export` run in moduleDir.
func exportData(moduleDir string, paths []string) (map[string]string, error) {
	out := map[string]string{}
	if len(paths) == 0 {
		return out, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("doctest: %w", err)
	}
	cmd := exec.Command(goBin, append([]string{"list", "-export", "-f", "{{.ImportPath}}\t{{.Export}}", "--"}, paths...)...)
	cmd.Dir = moduleDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("doctest: go list -export %s: %v\n%s", strings.Join(paths, " "), err, stderr.Bytes())
	}
	for line := range strings.Lines(string(stdout)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		if file != "" {
			out[path] = filepath.Clean(file)
		}
	}
	return out, nil
}

// Anchors returns the anchors of the headings of the Markdown text md, as
// GitHub makes them (see Slug), and those of its <a id="..."> and
// <a name="..."> tags. Headings inside code blocks do not count.
func Anchors(md []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(md) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		t := strings.TrimLeft(line, " ")
		if len(line)-len(t) > 3 || !strings.HasPrefix(t, "#") {
			continue
		}
		text := strings.TrimLeft(t, "#")
		if len(t)-len(text) > 6 || (text != "" && text[0] != ' ' && text[0] != '\t') {
			continue
		}
		slug := Slug(text)
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

var (
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	mdLink     = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// Slug returns the anchor GitHub gives a heading: its text (links reduced to
// their text, closing #s dropped), lower-cased, without punctuation, each
// space a hyphen.
func Slug(heading string) string {
	text := strings.TrimSpace(heading)
	text = strings.TrimSpace(strings.TrimRight(text, "#"))
	text = mdLink.ReplaceAllStringFunc(text, func(l string) string { return l[1:strings.Index(l, "](")] })
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// prose yields the lines of md outside fenced code blocks, each with its
// line number (from 1).
func prose(md []byte) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		fence := ""
		n := 0
		for line := range strings.Lines(string(md)) {
			n++
			line = strings.TrimRight(line, "\r\n")
			switch {
			case fence != "":
				if isCloseFence(line, fence) {
					fence = ""
				}
			default:
				if _, f, _, ok := openFence(line); ok {
					fence = f
					continue
				}
				if !yield(n, line) {
					return
				}
			}
		}
	}
}

// Link is a link from a Markdown or Go file to a file of the module, with
// an optional anchor.
type Link struct {
	From   string // file:line of the link
	Target string // the file linked to, relative to the module's root ("" for the linking file itself)
	Anchor string // the part after #, or ""
}

// MarkdownLinks returns the links of the Markdown file at path (relative to
// the module's root) that point into the module: not to a URL, and not
// inside code.
func MarkdownLinks(path string, md []byte) []Link {
	var links []Link
	lineNo := 0
	fence := ""
	for line := range strings.Lines(string(md)) {
		lineNo++
		line = strings.TrimRight(line, "\r\n")
		if fence != "" {
			if isCloseFence(line, fence) {
				fence = ""
			}
			continue
		}
		if _, f, _, ok := openFence(line); ok {
			fence = f
			continue
		}
		line = inlineCode.ReplaceAllString(line, "")
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(path), file))
			}
			links = append(links, Link{From: fmt.Sprintf("%s:%d", path, lineNo), Target: file, Anchor: anchor})
		}
	}
	return links
}

var goDocRef = regexp.MustCompile(`[\w./-]+\.md#[\w-]+`)

// GoLinks returns the references to a Markdown heading, such as
// docs/contract.md#5-fencing, in the Go file at path; they are relative to
// the module's root.
func GoLinks(path string, src []byte) []Link {
	var links []Link
	for i, line := range strings.Split(string(src), "\n") {
		for _, ref := range goDocRef.FindAllString(line, -1) {
			file, anchor, _ := strings.Cut(ref, "#")
			links = append(links, Link{From: fmt.Sprintf("%s:%d", path, i+1), Target: file, Anchor: anchor})
		}
	}
	return links
}

// delimiterRow matches a table's delimiter row: |---|:--:|---|.
var delimiterRow = regexp.MustCompile(`^\|?(\s*:?-+:?\s*\|)*\s*:?-+:?\s*\|?$`)

// TableProblems returns the faults, as "file:line: ..." messages, of the
// pipe tables (rows starting with |) of the Markdown file at path, outside
// code blocks: a header without a delimiter row under it, and a row whose
// cells do not match its header's. GitHub renders such a table without a
// word: it drops a row's extra cells and fills missing ones with nothing.
func TableProblems(path string, md []byte) []string {
	var problems []string
	header := 0     // cells of the current table's header; 0 outside a table
	headerLine := 0 // the line of a header not yet followed by its delimiter row
	last := 0       // the previous prose line: a gap is a code block, which ends a table
	noDelimiter := func() {
		problems = append(problems, fmt.Sprintf("%s:%d: a table's header without a delimiter row (|---|) under it", path, headerLine))
		headerLine = 0
	}
	for n, line := range prose(md) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || n != last+1 {
			if headerLine != 0 {
				noDelimiter()
			}
			header = 0
		}
		last = n
		at := fmt.Sprintf("%s:%d", path, n)
		switch {
		case !strings.HasPrefix(line, "|"):
		case headerLine != 0:
			if !delimiterRow.MatchString(line) {
				noDelimiter()
			} else if c := tableCells(line); c != header {
				problems = append(problems, fmt.Sprintf("%s: the delimiter row has %d cells, its header %d", at, c, header))
			}
			headerLine = 0
		case header == 0:
			header, headerLine = tableCells(line), n
		case delimiterRow.MatchString(line):
			problems = append(problems, at+": a second delimiter row: a row of dashes, or the header of another table written twice")
		default:
			if c := tableCells(line); c != header {
				problems = append(problems, fmt.Sprintf("%s: a row of %d cells in a table of %d", at, c, header))
			}
		}
	}
	if headerLine != 0 {
		noDelimiter()
	}
	return problems
}

// tableCells counts the cells of a table row: its pipes not escaped with a
// backslash (as GitHub splits them, inside code spans too), less the
// leading and trailing ones.
func tableCells(row string) int {
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	if strings.HasSuffix(row, `\`) { // the trailing pipe was escaped
		row += "|"
	}
	n := 1
	for i := 0; i < len(row); i++ {
		switch row[i] {
		case '\\':
			i++
		case '|':
			n++
		}
	}
	return n
}
