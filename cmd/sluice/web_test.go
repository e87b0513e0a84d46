package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
	"github.com/sluicehq/sluice/web/scenario"
)

func TestWebExport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "site", "nested")
	out := ok(t, "", "web", "--export", dir)
	if !strings.HasPrefix(out, "sluice web: wrote the page to "+dir) || !strings.Contains(out, "python3 -m http.server --directory "+dir) {
		t.Errorf("stdout %q", out)
	}
	for _, name := range web.Files() {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		resp := serveOne(t, web.Handler(), "/"+name)
		if !bytes.Equal(got, resp) {
			t.Errorf("%s differs from what sluice web serves", name)
		}
	}
}

func serveOne(t *testing.T, h http.Handler, path string) []byte {
	t.Helper()
	srv := &http.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

func TestWebBadInput(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"web", "--listen", "nonsense"}, "--listen nonsense: want host:port"},
		{[]string{"web", "--listen", "127.0.0.1:0", "--export", t.TempDir()}, "--listen and --export exclude each other"},
		{[]string{"web", "site"}, `web takes no arguments, got "site"`},
		{[]string{"web", "--bogus"}, "unknown flag: --bogus (see sluice web --help)"},
		{[]string{"web", "--listen"}, "flag needs an argument: --listen"},
		{[]string{"web", "--export", ""}, "--export: want a folder"},
		{[]string{"web", "--export", file}, "--export " + file + ": not a folder"},
	} {
		code, stdout, stderr := runCLI(t, "", tc.args...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "sluice: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("sluice %q: exit code %d, stdout %q, stderr %q; want 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// A port that is taken is a failure of the command's work, not of its input: exit code 1.
func TestWebListenFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, stdout, stderr := runCLI(t, "", "web", "--listen", ln.Addr().String())
	if code != 1 || stdout != "" || !strings.Contains(stderr, "address already in use") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("exit code %d, stdout %q, stderr %q; want 1 and one line saying the address is in use", code, stdout, stderr)
	}
}

// startWeb runs `sluice web --listen 127.0.0.1:0`'s server until the test ends, and returns its URL.
func startWeb(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serveWeb(ctx, "127.0.0.1:0", pw)
		pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("sluice web printed no address: %v", err)
	}
	go io.Copy(io.Discard, pr)
	const prefix = "sluice web: the simulation is at "
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("sluice web printed %q", line)
	}
	url := strings.Fields(strings.TrimPrefix(line, prefix))[0]
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sluice web stopped with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("sluice web did not stop")
		}
	})
	return url
}

func TestWebServes(t *testing.T) {
	url := startWeb(t)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" || !strings.Contains(string(b), "<title>sluice") {
		t.Errorf("GET %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	req, _ := http.NewRequest("GET", url+"sluice.wasm", nil)
	req.Header.Set("Accept-Encoding", "gzip") // set by hand, so the client does not decode it
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" || resp.Header.Get("Content-Type") != "application/wasm" {
		t.Errorf("GET sluice.wasm, gzip accepted: %d, %q, %q", resp.StatusCode, resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Type"))
	}
}

// The end-to-end test of the page: `sluice web` serves it to a real Chromium, 5/s then 40 in 1s
// is replayed, a number changes while the clock runs, and at the clock's end the page's summary is,
// number for number, what `sluice simulate --compare --format json` prints for the final inputs.
func TestWebPageMatchesSimulate(t *testing.T) {
	url := startWeb(t)
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1280, 900)}
	const pattern = "5/s for 10s; 40 in 1s; 5/s for 10s"
	page.Open(url + "?traffic=5/s+for+10s%3B+40+in+1s%3B+5/s+for+10s&limit=5&period=1s&burst=40")
	page.Click("#play") // the page opens on the whole run: Replay plays it from 0
	page.WaitBuckets(2)
	if !page.Running() {
		t.Fatal("the clock does not run")
	}
	page.Type("limit", "6")
	sc, errs := scenario.Parse("traffic=" + pattern + "&limit=6&period=1s&burst=40")
	if errs != nil {
		t.Fatal(errs)
	}
	page.Wait("the new limit to run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(sc.Encode()))
	if !page.Running() {
		t.Error("changing the limit stopped the clock")
	}
	page.Click(`input[name=speed][value="100"]`)
	got := page.WaitComplete(sc.Encode())

	cli := ok(t, "", "simulate", "--compare", "--format", "json", "--limit", "6", "--period", "1s", "--burst", "40", "--traffic", pattern)
	want := browsertest.SummariesFromJSON(t, cli)
	if len(want) != 5 {
		t.Fatalf("sluice simulate --compare gave %d runs", len(want))
	}
	if d := want.Diff(got); d != "" {
		t.Errorf("the page's summary differs from sluice simulate --compare --format json's:\n%s", d)
	}
}
