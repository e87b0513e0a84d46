package repotest

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// thisFile is skipped by the check of pointers into docs/design.md: it writes one as an example.
// The words check reads it too: it spells none of the words it looks for.
const thisFile = "internal/repotest/repo_test.go"

// skipped are files the repository carries but did not write (vendored, generated): their words
// are not the project's.
var skipped = []string{
	"go.sum",
	"web/package-lock.json",
	"web/assets/wasm_exec.js",
	"web/assets/uPlot.iife.min.js",
	"web/assets/uPlot.min.css",
	"web/assets/uPlot.LICENSE.txt",
}

// outsideWords are references to material outside the repository, which mean nothing to a reader
// of it: a design document it does not hold, and the names that the material the project was
// designed from gave its scenarios. A scenario is described by what it is instead ("5/s, then 40
// in one second"), a design point by a pointer to docs/design.md. The words are put together from
// parts (sd, ukr, designDoc) so that this file, which has to name them, does not contain them
// either; a random generator's or maphash's key of that name is not caught.
var outsideWords = []*regexp.Regexp{
	regexp.MustCompile(regexp.QuoteMeta(designDoc)), // docs/design.md, lower case, is the project's own
	regexp.MustCompile(`(?i)\bthe[\s/#*>-]+` + sd + `s?\b`),
	regexp.MustCompile(`(?i)` + sd + `s`),
	regexp.MustCompile(`(?i)` + sd + `'s`),
	regexp.MustCompile(`(?i)` + sd + `[\s_-]*scenarios?`),
	regexp.MustCompile(`(?i)` + ukr),
}

const (
	sd        = "se" + "ed"
	ukr       = "ukr" + "ain"
	designDoc = "DES" + "IGN.md"
)

// TestNoOutsideReferences fails on every reference to material outside the repository, in every
// file the repository holds (tracked, or new and not ignored).
func TestNoOutsideReferences(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root)
	checked := 0
	for _, name := range files {
		if slices.Contains(skipped, name) || vendored(name) {
			continue
		}
		text, ok := readText(t, root, name)
		if !ok {
			continue
		}
		checked++
		for _, re := range outsideWords {
			for _, m := range re.FindAllStringIndex(text, -1) {
				t.Errorf("%s:%d: %q refers to material outside the repository; point to docs/design.md or describe it by what it is",
					name, 1+strings.Count(text[:m[0]], "\n"), text[m[0]:m[1]])
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d text files found under %s; is this the repository?", checked, root)
	}
}

// TestMarkdownLinks checks that every relative link in the repository's Markdown leads to a file
// that exists and, with a #fragment, to a heading there; and that every pointer into
// docs/design.md written as docs/design.md#anchor (in comments, say) names one of its headings.
func TestMarkdownLinks(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root)
	if _, err := os.Stat(filepath.Join(root, "docs", "design.md")); err != nil {
		t.Fatalf("docs/design.md, the design the documents point to, is missing: %v", err)
	}
	anchors := map[string]map[string]bool{} // by file, the slugs of its headings
	anchorsOf := func(name string) map[string]bool {
		if a, ok := anchors[name]; ok {
			return a
		}
		text, _ := readText(t, root, name)
		a := headingSlugs(text)
		anchors[name] = a
		return a
	}
	link := regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^()\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	scheme := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	mds := 0
	for _, name := range files {
		if !strings.HasSuffix(name, ".md") || vendored(name) {
			continue
		}
		text, ok := readText(t, root, name)
		if !ok {
			continue
		}
		mds++
		for lineNo, line := range strings.Split(withoutCode(text), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
					continue // not a file of this repository
				}
				file, frag, _ := strings.Cut(target, "#")
				dest := name
				if file != "" {
					dest = path.Clean(path.Join(path.Dir(name), file))
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
						t.Errorf("%s:%d: link %q: %s does not exist", name, lineNo+1, target, dest)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
					t.Errorf("%s:%d: link %q: %s has no heading #%s", name, lineNo+1, target, dest, frag)
				}
			}
		}
	}
	if mds < 3 {
		t.Fatalf("only %d Markdown files found under %s", mds, root)
	}
	pointer := regexp.MustCompile(`docs/design\.md#([\w-]+)`)
	for _, name := range files {
		if name == thisFile || vendored(name) || slices.Contains(skipped, name) {
			continue
		}
		text, ok := readText(t, root, name)
		if !ok {
			continue
		}
		for _, m := range pointer.FindAllStringSubmatchIndex(text, -1) {
			if frag := text[m[2]:m[3]]; !anchorsOf("docs/design.md")[frag] {
				t.Errorf("%s:%d: docs/design.md has no heading #%s", name, 1+strings.Count(text[:m[0]], "\n"), frag)
			}
		}
	}
}

// The checks must catch what they are for (and, for the slugs, agree with how GitHub names
// headings), or a passing run would prove nothing.
func TestChecksCatch(t *testing.T) {
	for _, s := range []string{"see " + designDoc, "the " + sd + " scenario", "The\n// " + sd + "'s trace",
		"the " + sd + "s' cases", "TestCompareS" + "eedScenario", "the Ukr" + "ainian scenario", ukr + "ianTraffic"} {
		found := false
		for _, re := range outsideWords {
			found = found || re.MatchString(s)
		}
		if !found {
			t.Errorf("%q is not caught", s)
		}
	}
	for _, s := range []string{"docs/design.md", "maphash.S" + "eed", "maphash.MakeS" + "eed()", "s." + sd, "rand.NewPCG(" + sd + ", " + sd + "^0x5eed)",
		"FuzzedTraces(" + sd + " uint64", "the same " + sd, "the jitter's " + sd, "new-" + sd} {
		for _, re := range outsideWords {
			if re.MatchString(s) {
				t.Errorf("%q, a technical use, is caught by %v", s, re)
			}
		}
	}
	slugs := headingSlugs("# A title\n## `sluice serve`: the gateway\n### The algorithms, exactly\n```\n# not a heading\n```\n## A title\n#### Keys (Redis) × 2\n")
	for _, want := range []string{"a-title", "sluice-serve-the-gateway", "the-algorithms-exactly", "a-title-1", "keys-redis--2"} {
		if !slugs[want] {
			t.Errorf("no slug %q in %v", want, slugs)
		}
	}
	if slugs["not-a-heading"] {
		t.Error("a line in a code block was taken for a heading")
	}
}

// headingSlugs returns the anchors GitHub gives the headings of a Markdown text: lower case,
// punctuation dropped, spaces as hyphens, a repeated slug numbered -1, -2, ...
func headingSlugs(text string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		hashes := len(line) - len(strings.TrimLeft(line, "#"))
		if hashes < 1 || hashes > 6 || !strings.HasPrefix(line[hashes:], " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(line[hashes:])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			seen[slug]++
			slug += "-" + strconv.Itoa(n)
		} else {
			seen[slug] = 1
		}
		slugs[slug] = true
	}
	return slugs
}

// withoutCode blanks fenced code blocks and inline code spans, keeping the lines, so that code
// that looks like a link is not taken for one.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	fence := false
	span := regexp.MustCompile("`[^`]*`")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			lines[i] = ""
			continue
		}
		if fence {
			lines[i] = ""
			continue
		}
		lines[i] = span.ReplaceAllString(line, "``")
	}
	return strings.Join(lines, "\n")
}

// vendored reports the folders of other projects' files.
func vendored(name string) bool {
	return strings.HasPrefix(name, "vendor/") || strings.Contains(name, "node_modules/") || strings.Contains(name, "/vendor/")
}

// repoRoot is the module's root: the nearest folder up from here with a go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = parent
	}
}

// repoFiles lists the repository's files, slash-separated and relative to root: git's tracked
// files and new ones it does not ignore; without git (an exported tree), every file but those in
// .git, node_modules and the build's output folders.
func repoFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range bytes.Split(out, []byte{0}) {
			if len(f) > 0 {
				files = append(files, string(f))
			}
		}
		slices.Sort(files)
		return slices.Compact(files)
	}
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "artifacts", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// readText returns a file's text; ok is false for a binary file (a NUL byte) or one listed but
// gone from the work tree (deleted, not yet committed).
func readText(t *testing.T, root, name string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return "", false
	}
	return string(b), true
}
