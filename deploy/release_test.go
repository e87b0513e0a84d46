package deploy

// The release (scripts/release.sh, .github/workflows/release.yml, CHANGELOG.md): a snapshot is
// built here as CI builds a release, into a temporary directory with a podman of its own, and
// every file it makes is opened and checked — the binaries' formats and what they say, the
// checksums, the SBOMs against go.mod, the image's manifest list, the chart — and the release's
// amd64 image passes the container tests the image built by scripts/build-image.sh passes.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const releaseModule = "github.com/sluicehq/sluice"

// releaseRun runs scripts/release.sh with args in the repository, with env, and returns its
// standard output, standard error and exit code.
func releaseRun(t *testing.T, timeout time.Duration, env []string, args ...string) (string, string, int) {
	t.Helper()
	return releaseRunIn(t, "..", timeout, env, args...)
}

// releaseRunIn runs dir/scripts/release.sh.
func releaseRunIn(t *testing.T, dir string, timeout time.Duration, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(dir, "scripts", "release.sh")}, args...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		exit, ok := err.(*exec.ExitError)
		if !ok || ctx.Err() != nil {
			t.Fatalf("scripts/release.sh %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		code = exit.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

func releaseGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// A bad flag or version is refused with exit code 2 and a message that names it, before
// anything is built.
func TestReleaseRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "give --snapshot, or --version vX.Y.Z"},
		{[]string{"--bogus"}, `unknown argument "--bogus"`},
		{[]string{"--snapshot", "--publish"}, "--snapshot and --publish exclude each other"},
		{[]string{"--snapshot", "--version", "v1.0.0"}, "--snapshot takes no --version"},
		{[]string{"--version", "1.2.3"}, `--version "1.2.3": not a release version vX.Y.Z`},
		{[]string{"--version", "v1.2"}, `--version "v1.2": not a release version`},
		{[]string{"--version", "v01.2.3"}, `--version "v01.2.3": not a release version`},
		{[]string{"--version", "v1.2.3-"}, `--version "v1.2.3-": not a release version`},
		{[]string{"--version"}, "--version needs a value"},
		{[]string{"--out"}, "--out needs a value"},
		{[]string{"--publish"}, "give --snapshot, or --version vX.Y.Z"},
		{[]string{"--notes", "1.0"}, `--notes "1.0": not a version`},
		{[]string{"--notes", "v0.1.0", "--snapshot"}, "--notes takes no other flag"},
	} {
		_, stderr, code := releaseRun(t, time.Minute, os.Environ(), tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("release.sh %q: exit %d, %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// releaseRepo is a git repository holding release.sh and the CHANGELOG.md given, one commit.
func releaseRepo(t *testing.T, changelog string) string {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("..", "scripts", "release.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"scripts/release.sh": string(script), "CHANGELOG.md": changelog} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	releaseGit(t, dir, "init", "-q")
	releaseGit(t, dir, "add", ".")
	releaseGit(t, dir, "commit", "-q", "-m", "release")
	return dir
}

// A publish is refused unless HEAD is the version's tag and the work tree is clean; a release
// whose version has no section in CHANGELOG.md is refused too. (Each is refused before any
// build: the repository here holds nothing to build.)
func TestReleaseRefusesToPublish(t *testing.T) {
	dir := releaseRepo(t, "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-12-06\n\n- First.\n")
	try := func(want string, args ...string) {
		t.Helper()
		_, stderr, code := releaseRunIn(t, dir, time.Minute, os.Environ(), args...)
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("release.sh %q: exit %d, %q; want exit 1 and %q", args, code, stderr, want)
		}
	}
	try("HEAD ("+releaseGit(t, dir, "rev-parse", "--short", "HEAD")+") is not tagged v0.1.0", "--version", "v0.1.0", "--publish")
	releaseGit(t, dir, "tag", "v0.2.0")
	try("is not tagged v0.1.0", "--version", "v0.1.0", "--publish")
	try(`CHANGELOG.md has no section "## [0.2.0]"`, "--version", "v0.2.0", "--publish")
	releaseGit(t, dir, "tag", "v0.1.0")
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte("# Changelog\n\n## [0.1.0]\n\n- Changed.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	try("refusing to publish from a work tree with changes", "--version", "v0.1.0", "--publish")
	if err := os.WriteFile(filepath.Join(dir, "stray.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	releaseGit(t, dir, "checkout", "-q", "--", "CHANGELOG.md")
	try("refusing to publish from a work tree with changes", "--version", "v0.1.0", "--publish")
}

// --notes prints a version's section of CHANGELOG.md, without its heading, up to the next
// section or the links at the end: the GitHub release's notes.
func TestReleaseNotes(t *testing.T) {
	dir := releaseRepo(t, `# Changelog

Intro.

## [Unreleased]

- Next.

## [1.0.0] - 2026-12-24

### Added

- One.
- Two.

## [0.9.0-rc.1] - 2026-12-01

- Earlier.

[Unreleased]: https://example.com/compare/v1.0.0...HEAD
[1.0.0]: https://example.com/v1.0.0
`)
	for _, tc := range []struct{ version, want string }{
		{"v1.0.0", "### Added\n\n- One.\n- Two.\n"},
		{"v0.9.0-rc.1", "- Earlier.\n"},
		{"Unreleased", "- Next.\n"},
	} {
		out, stderr, code := releaseRunIn(t, dir, time.Minute, os.Environ(), "--notes", tc.version)
		if code != 0 || out != tc.want {
			t.Errorf("--notes %s: exit %d, %q (%s); want %q", tc.version, code, out, stderr, tc.want)
		}
	}
	if _, stderr, code := releaseRunIn(t, dir, time.Minute, os.Environ(), "--notes", "v1.0"+".1"); code != 1 || !strings.Contains(stderr, `no section "## [1.0.1]"`) {
		t.Errorf("--notes v1.0.1: exit %d, %q; want exit 1, no section", code, stderr)
	}

	// The repository's own CHANGELOG.md has the first release's section, with the groups the
	// release notes promise.
	out, stderr, code := releaseRun(t, time.Minute, os.Environ(), "--notes", "v0.1.0")
	if code != 0 {
		t.Fatalf("--notes v0.1.0 on CHANGELOG.md: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"### Algorithms and stores", "### Envoy, Istio and Envoy Gateway", "### Deployment", "ghcr.io/sluicehq/sluice"} {
		if !strings.Contains(out, want) {
			t.Errorf("CHANGELOG.md's 0.1.0 notes have no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "## [") || strings.Contains(out, "]: https://") {
		t.Errorf("CHANGELOG.md's 0.1.0 notes run into another section or the links:\n%s", out)
	}
}

// releaseShellcheck is shellcheck's path; the release's tests need it (scripts/test.sh installs it).
func releaseShellcheck(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Fatal("shellcheck is not installed: the release's tests need it (Debian: apt-get install shellcheck; scripts/test.sh installs it)")
	}
	return path
}

// The release's scripts pass shellcheck with no finding.
func TestReleaseScriptsShellcheck(t *testing.T) {
	cmd := exec.Command(releaseShellcheck(t), "scripts/release.sh", "scripts/gotool.sh", "scripts/build-image.sh")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}

// The workflow passes actionlint (built pinned by scripts/gotool.sh; its run: blocks checked by
// shellcheck) with no finding, runs on version tags with the permissions it needs, pins each
// action to a version, and calls the script as docs/releasing.md says.
func TestReleaseWorkflow(t *testing.T) {
	bin := strings.TrimSpace(releaseTool(t, "actionlint"))
	shellcheck := releaseShellcheck(t)
	workflows, err := filepath.Glob(filepath.Join("..", ".github", "workflows", "*.yml"))
	if err != nil || len(workflows) == 0 {
		t.Fatalf("no workflows in .github/workflows (%v)", err)
	}
	for i, w := range workflows {
		workflows[i] = strings.TrimPrefix(w, ".."+string(filepath.Separator))
	}
	cmd := exec.Command(bin, append([]string{"-no-color", "-shellcheck", shellcheck}, workflows...)...)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("actionlint %s: %v\n%s", strings.Join(workflows, " "), err, out)
	}

	text, err := os.ReadFile(filepath.Join("..", ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Permissions map[string]string `yaml:"permissions"`
		Jobs        map[string]struct {
			Steps []struct {
				Uses string `yaml:"uses"`
				Run  string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(text, &wf); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wf.On.Push.Tags, []string{"v*"}) {
		t.Errorf("release.yml runs on tags %q, want [v*]", wf.On.Push.Tags)
	}
	if wf.Permissions["contents"] != "write" || wf.Permissions["packages"] != "write" || len(wf.Permissions) != 2 {
		t.Errorf("release.yml's permissions %v, want contents: write and packages: write only", wf.Permissions)
	}
	pinned := regexp.MustCompile(`^[\w.-]+/[\w.-]+@v\d+\.\d+\.\d+$`)
	var runs strings.Builder
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			if s.Uses != "" && !pinned.MatchString(s.Uses) {
				t.Errorf("release.yml uses %q: not pinned to a version (owner/name@vX.Y.Z)", s.Uses)
			}
			runs.WriteString(s.Run + "\n")
		}
	}
	for _, want := range []string{
		`scripts/release.sh --version "$GITHUB_REF_NAME" --publish`,
		`scripts/release.sh --notes "$GITHUB_REF_NAME"`,
		`podman login ghcr.io -u "$GITHUB_ACTOR" --password-stdin`,
		`gh release create "$GITHUB_REF_NAME"`,
		`dist/*.tar.gz dist/*.cdx.json dist/checksums.txt`,
	} {
		if !strings.Contains(runs.String(), want) {
			t.Errorf("release.yml's steps run no %q", want)
		}
	}
}

// releaseTool is scripts/gotool.sh's path of a pinned tool, built on first use.
func releaseTool(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a cold build
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "scripts", "gotool.sh"), name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/gotool.sh %s: %v\n%s", name, err, stderr.String())
	}
	return string(out)
}

// goModVersions is go.mod's required modules and their versions.
func goModVersions(t *testing.T) map[string]string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mods := map[string]string{}
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && strings.Contains(f[0], ".") && strings.HasPrefix(f[1], "v") {
			mods[f[0]] = f[1]
		}
	}
	return mods
}

// releaseArchive reads a .tar.gz: each regular file's name and contents, and each entry's mode.
func releaseArchive(t *testing.T, path string) (map[string][]byte, map[string]int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	files, modes := map[string][]byte{}, map[string]int64{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		modes[h.Name] = h.Mode
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
	return files, modes
}

// releaseTarFile is one file of an uncompressed tar archive.
func releaseTarFile(t *testing.T, path, name string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no %s in it (%v)", path, name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestReleaseSnapshot runs `scripts/release.sh --snapshot` and checks what it made.
func TestReleaseSnapshot(t *testing.T) {
	pm := containerPodman(t)
	out := filepath.Join(t.TempDir(), "dist")
	chartBefore, err := os.ReadFile(filepath.Join(helmChart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := append(slices.Clone(pm.env), "HELM="+helmBinary(t))
	start := time.Now()
	stdout, stderr, code := releaseRun(t, 25*time.Minute, env, "--snapshot", "--out", out)
	if code != 0 {
		t.Fatalf("release.sh --snapshot: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("release.sh --snapshot took %s", time.Since(start).Round(time.Second))
	if after, _ := os.ReadFile(filepath.Join(helmChart, "Chart.yaml")); !bytes.Equal(after, chartBefore) {
		t.Errorf("release.sh changed the repository's Chart.yaml")
	}

	// The version: the last release tag's (0.0.0 before one), -SNAPSHOT-, the short commit,
	// -dirty when this work tree has changes.
	commit := releaseGit(t, "..", "rev-parse", "HEAD")
	short := releaseGit(t, "..", "rev-parse", "--short", "HEAD")
	epoch, err := strconv.ParseInt(releaseGit(t, "..", "log", "-1", "--format=%ct", "HEAD"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	date := time.Unix(epoch, 0).UTC().Format("2006-01-02T15:04:05Z")
	archives, _ := filepath.Glob(filepath.Join(out, "sluice_*_linux_amd64.tar.gz"))
	if len(archives) != 1 {
		t.Fatalf("%s: %d linux/amd64 archives, want 1\n%s", out, len(archives), stdout)
	}
	ver := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(archives[0]), "sluice_"), "_linux_amd64.tar.gz")
	if !regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?-SNAPSHOT-` + short + `(-dirty)?$`).MatchString(ver) {
		t.Fatalf("the snapshot's version %q, want X.Y.Z-SNAPSHOT-%s[-dirty]", ver, short)
	}
	version := "v" + ver
	t.Logf("snapshot %s", ver)

	// Every file, and nothing else.
	targets := []struct {
		os, arch string
		elf      elf.Machine
		macho    macho.Cpu
	}{
		{"linux", "amd64", elf.EM_X86_64, 0},
		{"linux", "arm64", elf.EM_AARCH64, 0},
		{"darwin", "amd64", 0, macho.CpuAmd64},
		{"darwin", "arm64", 0, macho.CpuArm64},
	}
	want := []string{"checksums.txt", "sluice-" + ver + ".tgz", "sluice_" + ver + "_image.oci.tar"}
	for _, tg := range targets {
		want = append(want, fmt.Sprintf("sluice_%s_%s_%s.tar.gz", ver, tg.os, tg.arch), fmt.Sprintf("sluice_%s_%s_%s.cdx.json", ver, tg.os, tg.arch))
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("release.sh made %q\nwant %q", got, want)
	}

	// The archives: the binary for its platform, static, and the license files.
	readme, _ := os.ReadFile(filepath.Join("..", "README.md"))
	var linuxBin string
	for _, tg := range targets {
		name := fmt.Sprintf("sluice_%s_%s_%s.tar.gz", ver, tg.os, tg.arch)
		files, modes := releaseArchive(t, filepath.Join(out, name))
		var names []string
		thirdParty := map[string]bool{} // module path -> a license file of it is in the archive
		for n := range files {
			if rest, ok := strings.CutPrefix(n, "licenses/third_party/"); ok {
				if i := strings.LastIndex(rest, "/"); i > 0 && len(files[n]) > 0 {
					thirdParty[rest[:i]] = true
				}
				continue
			}
			names = append(names, n)
		}
		slices.Sort(names)
		if wantNames := []string{"LICENSE", "NOTICE", "README.md", "licenses/Go-LICENSE.txt", "sluice", "web/assets/uPlot.LICENSE.txt"}; !slices.Equal(names, wantNames) {
			t.Errorf("%s holds %q, want %q", name, names, wantNames)
		}
		// Every module linked into the binary (its build information says which) has its
		// license beside it, and no other module's is there.
		bi, err := buildinfo.Read(bytes.NewReader(files["sluice"]))
		if err != nil {
			t.Fatalf("%s: sluice's build information: %v", name, err)
		}
		if len(bi.Deps) < 10 {
			t.Fatalf("%s: sluice lists %d modules", name, len(bi.Deps))
		}
		linked := map[string]bool{}
		for _, d := range bi.Deps {
			linked[d.Path] = true
			if !thirdParty[d.Path] {
				t.Errorf("%s: no license of %s, which sluice links, under licenses/third_party/", name, d.Path)
			}
		}
		for m := range thirdParty {
			if !linked[m] {
				t.Errorf("%s: licenses/third_party/%s, a module sluice does not link", name, m)
			}
		}
		if !bytes.Equal(files["README.md"], readme) {
			t.Errorf("%s: README.md is not the repository's", name)
		}
		if modes["sluice"] != 0o755 {
			t.Errorf("%s: sluice's mode %o, want 755", name, modes["sluice"])
		}
		bin := files["sluice"]
		switch tg.os {
		case "linux":
			f, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("%s: sluice is not ELF: %v", name, err)
			}
			if f.Machine != tg.elf {
				t.Errorf("%s: sluice is for %v, want %v", name, f.Machine, tg.elf)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s: sluice has an interpreter: not static", name)
				}
			}
			if tg.arch == "amd64" {
				linuxBin = filepath.Join(t.TempDir(), "sluice")
				if err := os.WriteFile(linuxBin, bin, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		case "darwin":
			f, err := macho.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("%s: sluice is not Mach-O: %v", name, err)
			}
			if f.Cpu != tg.macho {
				t.Errorf("%s: sluice is for %v, want %v", name, f.Cpu, tg.macho)
			}
		}
	}

	// The linux/amd64 binary says the snapshot's version, commit and the commit's date, in
	// --version and in sluice_build_info.
	wantLine := fmt.Sprintf("sluice %s (commit %s, %s)", version, commit, date)
	if b, err := exec.Command(linuxBin, "--version").Output(); err != nil || strings.TrimSpace(string(b)) != wantLine {
		t.Errorf("sluice --version: %q (%v), want %q", b, err, wantLine)
	}
	releaseBuildInfo(t, linuxBin, version, commit, date)

	// checksums.txt: one line per other file, each right.
	sums, err := os.ReadFile(filepath.Join(out, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var summed []string
	for _, line := range strings.Split(strings.TrimSuffix(string(sums), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("checksums.txt: line %q is not sha256sum's", line)
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("checksums.txt names %q: %v", name, err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("checksums.txt: %s's sum is wrong", name)
		}
		summed = append(summed, name)
	}
	if wantSummed := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return n == "checksums.txt" }); !slices.Equal(summed, wantSummed) {
		t.Errorf("checksums.txt sums %q, want %q", summed, wantSummed)
	}

	// The SBOMs: CycloneDX JSON naming the module at the version and the modules linked in, at
	// go.mod's versions, for the binary's platform.
	mods := goModVersions(t)
	for _, tg := range targets {
		name := fmt.Sprintf("sluice_%s_%s_%s.cdx.json", ver, tg.os, tg.arch)
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		var bom struct {
			BOMFormat   string `json:"bomFormat"`
			SpecVersion string `json:"specVersion"`
			Metadata    struct {
				Component struct{ Name, Version, Purl string } `json:"component"`
			} `json:"metadata"`
			Components []struct{ Name, Version, Purl string } `json:"components"`
		}
		if err := json.Unmarshal(b, &bom); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if bom.BOMFormat != "CycloneDX" || bom.SpecVersion == "" {
			t.Errorf("%s: bomFormat %q, specVersion %q; want CycloneDX", name, bom.BOMFormat, bom.SpecVersion)
		}
		if c := bom.Metadata.Component; c.Name != releaseModule || c.Version != version {
			t.Errorf("%s: the component is %s %s, want %s %s", name, c.Name, c.Version, releaseModule, version)
		}
		platform := fmt.Sprintf("goarch=%s&goos=%s", tg.arch, tg.os)
		if !strings.Contains(bom.Metadata.Component.Purl, platform) {
			t.Errorf("%s: the component's purl %q does not say %s", name, bom.Metadata.Component.Purl, platform)
		}
		found := map[string]string{}
		for _, c := range bom.Components {
			found[c.Name] = c.Version
		}
		for _, dep := range []string{"github.com/redis/rueidis", "github.com/prometheus/client_golang", "github.com/spf13/cobra"} {
			if mods[dep] == "" || found[dep] != mods[dep] {
				t.Errorf("%s: %s at %q, go.mod requires %q", name, dep, found[dep], mods[dep])
			}
		}
		if _, ok := found["github.com/chromedp/chromedp"]; ok {
			t.Errorf("%s names chromedp, which only the tests use: not the binary's modules", name)
		}
	}

	// The image: a manifest list of linux/amd64 and linux/arm64, each its tagged image.
	image := "ghcr.io/sluicehq/sluice:" + ver
	var list struct {
		Manifests []struct {
			Digest   string `json:"digest"`
			Platform struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal([]byte(pm.run(t, "manifest", "inspect", image)), &list); err != nil {
		t.Fatalf("podman manifest inspect %s: %v", image, err)
	}
	platforms := map[string]string{}
	for _, m := range list.Manifests {
		platforms[m.Platform.OS+"/"+m.Platform.Architecture] = m.Digest
	}
	if len(platforms) != 2 || platforms["linux/amd64"] == "" || platforms["linux/arm64"] == "" {
		t.Fatalf("%s's manifest list: %v, want linux/amd64 and linux/arm64", image, platforms)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		tagged := image + "-" + arch
		got := strings.Fields(pm.run(t, "image", "inspect", "--format", "{{.Os}} {{.Architecture}} {{.Digest}} {{index .Labels \"org.opencontainers.image.version\"}}", tagged))
		if !slices.Equal(got, []string{"linux", arch, platforms["linux/"+arch], version}) {
			t.Errorf("%s: %q, want linux %s, the manifest list's digest %s and version %s", tagged, got, arch, platforms["linux/"+arch], version)
		}
	}

	// The OCI archive holds the same list, under the version.
	archive := filepath.Join(out, "sluice_"+ver+"_image.oci.tar")
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(releaseTarFile(t, archive, "index.json"), &index); err != nil || len(index.Manifests) != 1 ||
		index.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ver {
		t.Fatalf("%s: index.json %+v (%v), want one list named %s", archive, index, err, ver)
	}
	inner := releaseTarFile(t, archive, "blobs/sha256/"+strings.TrimPrefix(index.Manifests[0].Digest, "sha256:"))
	if err := json.Unmarshal(inner, &list); err != nil {
		t.Fatal(err)
	}
	var archived []string
	for _, m := range list.Manifests {
		archived = append(archived, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	slices.Sort(archived)
	if !slices.Equal(archived, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("%s holds %q, want linux/amd64 and linux/arm64", archive, archived)
	}

	// The chart: version and appVersion the snapshot's, so that its default image is the
	// release's.
	chartFiles, _ := releaseArchive(t, filepath.Join(out, "sluice-"+ver+".tgz"))
	var meta struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(chartFiles["sluice/Chart.yaml"], &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version != ver || meta.AppVersion != ver {
		t.Errorf("the chart: version %q, appVersion %q; want %s for both", meta.Version, meta.AppVersion, ver)
	}

	// The packaged chart, rendered as a user installs it, runs the image this release built.
	rendered, err := helmRun(t, "template", "sluice", filepath.Join(out, "sluice-"+ver+".tgz"), "-f", helmValues(t, helmRequired))
	if err != nil {
		t.Fatalf("helm template of the packaged chart: %v", err)
	}
	objs, err := helmDecode(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var images []string
	for _, o := range objs {
		if o.kind() == "Deployment" {
			for _, c := range helmList(helmGet(o, "spec", "template", "spec", "containers")) {
				images = append(images, helmStr(helmGet(c, "image")))
			}
		}
	}
	if !slices.Equal(images, []string{image}) {
		t.Errorf("the packaged chart's Deployment runs %q, want the release's image %s", images, image)
	}

	// The container tests, on the release's amd64 image.
	amd64 := image + "-amd64"
	pm.checkImage(t, amd64)
	t.Run("serves through Redis", func(t *testing.T) { containerServesThroughRedis(t, pm, amd64) })
	t.Run("as Istio's ratelimit", func(t *testing.T) { imageAsIstioRateLimit(t, pm, amd64) })
	t.Run("as Envoy Gateway's ratelimit", func(t *testing.T) { imageAsEnvoyGatewayRateLimit(t, pm, amd64) })
}

// releaseBuildInfo runs the binary's `serve` and checks that its sluice_build_info says the
// version, commit and date.
func releaseBuildInfo(t *testing.T, bin, version, commit, date string) {
	t.Helper()
	dir := t.TempDir()
	admin := fmt.Sprintf("127.0.0.1:%d", containerFreePort(t))
	cfg := filepath.Join(dir, "sluice.yaml")
	conf := fmt.Sprintf("listen: \"\"\nadmin_listen: %s\nstore: {type: memory}\npolicies:\n  - {name: anonymous, algorithm: fixed-window, limit: 1, period: 1s}\ndefault_policy: anonymous\n", admin)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfg, "--watch", "0")
	var stderr syncedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://" + admin + "/metrics")
		if err == nil {
			var line string
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "sluice_build_info{") {
					line = sc.Text()
				}
			}
			resp.Body.Close()
			for _, want := range []string{`version="` + version + `"`, `commit="` + commit + `"`, `commit_time="` + date + `"`} {
				if !strings.Contains(line, want) {
					t.Errorf("the release binary's sluice_build_info %q has no %s", line, want)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the release binary's admin listener %s did not answer: %v\n%s", admin, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling for the listener, with a deadline
	}
}

// syncedBuffer is a bytes.Buffer a process writes while the test reads it.
type syncedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
