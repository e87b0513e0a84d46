package main

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoE2EPrintedCommand: `sluice serve` without a configuration prints a `sluice demo`
// command to try; run as printed, against that demo, it sees 429s and held requests, read both
// from what it prints and from the gateway's own counters. Nothing depends on how fast the
// machine is: the anonymous bucket starts full (20) and gets one request back a second, so 25 at
// once get at least 20 answers and a refusal unless they take 5 s; the queue starts empty with room
// for 6, so 6 at once are never refused and are held unless they arrive half a second apart.
func TestDemoE2EPrintedCommand(t *testing.T) {
	t.Parallel()
	p, err := launch(t, t.TempDir(), "", nil, "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	args := printedDemo(t, p)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = sluiceEnv()
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%q: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	t.Logf("%q:\n%s", args, out)

	hello := regexp.MustCompile(`25 requests at once to \S+/hello, from one address:\n  (\d+) answered 200, (\d+) refused 429 \(Retry-After: (\d+)\)\.`).FindStringSubmatch(out)
	if hello == nil {
		t.Fatalf("no count of the burst's answers and 429s with Retry-After in\n%s", out)
	}
	answered, refused := atoi(t, hello[1]), atoi(t, hello[2])
	if answered < 20 || refused < 1 || answered+refused != 25 || atoi(t, hello[3]) < 1 {
		t.Errorf("the burst to /hello: %d answered, %d refused, Retry-After %s; want at least 20 answered (a full bucket) and a refusal, 25 in all", answered, refused, hello[3])
	}
	for _, want := range []string{`RateLimit-Policy: "anonymous";q=10;w=10`, "the policy: q=10 requests per w=10 seconds",
		`RateLimit: "anonymous";r=19;t=1`, "r above q: a token bucket saves", `RateLimit: "anonymous";r=0;t=`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in what the demo command printed", want)
		}
	}
	if !strings.Contains(out, "6 requests at once to "+p.proxy+"/queue, a leaky bucket:\n  6 answered 200, none refused.") {
		t.Errorf("the queue refused, or its count is missing: want 6 answered 200, none refused")
	}
	m := regexp.MustCompile(`The gateway held (\d+) of them, ([0-9.]+) s in all`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no count of held requests in\n%s", out)
	}
	held := atoi(t, m[1])
	if held < 1 || held > 5 {
		t.Errorf("the gateway held %d of the 6; want 1 to 5 (the first is served at once)", held)
	}

	// What the gateway itself counted, beside what the command says.
	metrics := p.metricsText(t)
	if n := sampleSum(metrics, "sluice_decisions_total", map[string]string{"policy": "anonymous", "result": "refused"}); int(n) != refused {
		t.Errorf("the gateway refused %v for the anonymous policy; the demo command says %d", n, refused)
	}
	if n := sampleSum(metrics, "sluice_decisions_total", map[string]string{"policy": "queue", "result": "delayed"}); int(n) != held {
		t.Errorf("the gateway delayed %v on the queue; the demo command says %d", n, held)
	}
}

// printedDemo waits for the demo p to print what to try, and returns its `sluice demo` command
// line, split into its words.
func printedDemo(t *testing.T, p *sluiceProc) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.stdout.String(), "Stop with Ctrl-C.") {
		if time.Now().After(deadline) {
			t.Fatalf("the demo printed no help within 20 s\nstdout:\n%s\nstderr:\n%s", p.stdout.String(), p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, line := range strings.Split(p.stdout.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == sluiceBinary(t) && f[1] == "demo" {
			if want := []string{"--proxy", p.proxy, "--admin", p.admin}; strings.Join(f[2:], " ") != strings.Join(want, " ") {
				t.Errorf("the printed command %q; want its flags %q (the demo's own listeners)", line, want)
			}
			return f
		}
	}
	t.Fatalf("the demo printed no `%s demo` command:\n%s", sluiceBinary(t), p.stdout.String())
	return nil
}

// TestDemoNotRunning: `sluice demo` with no demo there fails with exit code 1 and says to start it.
func TestDemoNotRunning(t *testing.T) {
	addr, err := freeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "", "demo", "--proxy", "http://"+addr, "--admin", "")
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 ||
		!strings.Contains(stderr, addr+"/hello") || !strings.Contains(stderr, "is the demo running? Start it with `sluice serve`") {
		t.Errorf("exit code %d, stdout %q, stderr %q; want 1, nothing, and one line naming the URL and saying to start the demo", code, stdout, stderr)
	}
}
