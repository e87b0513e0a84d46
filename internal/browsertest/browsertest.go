// Package browsertest drives a real headless Chromium (Debian's chromium package) through the
// DevTools protocol (chromedp), for the tests of sluice's web pages. There is no fake: a test
// that needs a browser gets one, and fails — it does not skip — when Chromium is missing
// (scripts/test.sh installs it).
//
// Chromium runs headless, without a sandbox (tests run as root in CI), with a fresh profile, and
// with everything that would reach the network turned off: the machines that run the tests have
// no network but the loopback.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Timeout bounds each tab's life: a test that waits for a page longer than this fails.
const Timeout = 45 * time.Second

// Path returns the Chromium executable: $CHROMIUM if set, else chromium (or chromium-browser) on
// PATH, else /usr/bin/chromium. It fails the test if there is none.
func Path(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Fatal("browsertest: Chromium is not installed: run scripts/test.sh, which installs it (Debian: apt-get install chromium), or set CHROMIUM to its path")
	return ""
}

// Flags are the command-line flags Chromium runs with, besides a fresh --user-data-dir.
var Flags = []chromedp.ExecAllocatorOption{
	chromedp.Flag("headless", true),
	chromedp.Flag("no-sandbox", true),
	chromedp.Flag("disable-gpu", true),
	chromedp.Flag("disable-quic", true),
	chromedp.Flag("no-first-run", true),
	chromedp.Flag("no-default-browser-check", true),
	chromedp.Flag("disable-background-networking", true),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-sync", true),
	chromedp.Flag("disable-default-apps", true),
	chromedp.Flag("disable-extensions", true),
	chromedp.Flag("disable-breakpad", true),
	chromedp.Flag("disable-dev-shm-usage", true), // /dev/shm is small in containers
	chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints"),
	chromedp.Flag("metrics-recording-only", true),
	chromedp.Flag("safebrowsing-disable-auto-update", true),
	chromedp.Flag("password-store", "basic"),
	chromedp.Flag("use-mock-keychain", true),
	chromedp.Flag("hide-scrollbars", true),
	chromedp.Flag("mute-audio", true),
	chromedp.Flag("force-color-profile", "srgb"),
}

// Tab is one browser tab, in a Chromium of its own, closed when the test ends. It records what
// the page writes to its console.
type Tab struct {
	Ctx context.Context // run chromedp actions on it: chromedp.Do(tab.Ctx, ...)
	t   testing.TB

	mu       sync.Mutex
	problems []string // console errors and uncaught exceptions, as the console shows them
}

// NewTab starts Chromium with a window of width×height CSS pixels and opens a tab. When the test
// ends, it fails the test if the page wrote an error or threw an exception (see Problems), then
// stops Chromium.
func NewTab(t testing.TB, width, height int) *Tab {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Path(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	}, Flags...)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, Timeout)
	tab := &Tab{Ctx: ctx, t: t}

	// Subscribe before anything loads, so that no message is lost.
	console := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range console {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleException:
				where := ""
				if m.URL != "" {
					where = " (" + m.URL + ")"
				}
				tab.mu.Lock()
				tab.problems = append(tab.problems, m.String()+where)
				tab.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		for _, p := range tab.Problems() {
			t.Errorf("the page's console: %s", p)
		}
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		<-done
	})
	// Start the browser now, so that a missing or broken Chromium fails here, clearly.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("browsertest: starting %s: %v", Path(t), err)
	}
	return tab
}

// Problems returns the errors and exceptions the page has written to its console so far.
func (tab *Tab) Problems() []string {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	return append([]string(nil), tab.problems...)
}

// TakeProblems returns the problems recorded so far and forgets them: for a test that expects
// them.
func (tab *Tab) TakeProblems() []string {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	p := tab.problems
	tab.problems = nil
	return p
}

// Do runs actions in the tab and fails the test, saying what it was doing, if one fails.
func (tab *Tab) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tab.t.Helper()
	if err := chromedp.Do(tab.Ctx, actions...); err != nil {
		tab.t.Fatalf("%s: %v (console: %q)", what, err, tab.Problems())
	}
}

// Eval evaluates a JavaScript expression and decodes its value into T, failing the test on error.
func Eval[T any](tab *Tab, expression string) T {
	tab.t.Helper()
	v, err := chromedp.Run(tab.Ctx, chromedp.Evaluate[T](expression))
	if err != nil {
		tab.t.Fatalf("evaluating %s: %v (console: %q)", expression, err, tab.Problems())
	}
	return v
}

// Wait waits until a JavaScript expression is truthy (checked on every animation frame), failing
// the test with what it waited for if it is not within Timeout.
func (tab *Tab) Wait(what, expression string) {
	tab.t.Helper()
	if _, err := chromedp.Run(tab.Ctx, chromedp.Poll[chromedp.Void](expression)); err != nil {
		tab.t.Fatalf("waiting for %s (%s): %v (console: %q)", what, expression, err, tab.Problems())
	}
}

// Screenshot saves a full-page PNG of the tab as artifacts/NAME.png at the repository's root,
// where CI keeps test artifacts.
func (tab *Tab) Screenshot(name string) {
	tab.t.Helper()
	png, err := chromedp.Run(tab.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tab.t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := filepath.Join(RepoRoot(tab.t), "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tab.t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tab.t.Fatal(err)
	}
	tab.t.Logf("screenshot: %s", path)
}

// RepoRoot returns the repository's root: the nearest folder above the test's that holds go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("browsertest: no go.mod above %s", dir)
		}
	}
}

// JSString quotes s as a JavaScript string literal (for building expressions).
func JSString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`, "\r", `\r`, "\u2028", `\u2028`, "\u2029", `\u2029`)
	return "'" + r.Replace(s) + "'"
}
