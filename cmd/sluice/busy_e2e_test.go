package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// busyCPU starts stress-ng with n CPU workers beside the test, for at most a minute, stopped when
// the test ends, and returns once its workers run. The test fails, rather than skips, without
// stress-ng: scripts/test.sh installs it.
func busyCPU(t *testing.T, n int) {
	t.Helper()
	bin, err := exec.LookPath("stress-ng")
	if err != nil {
		t.Fatalf("stress-ng is needed to load the CPU beside this test (scripts/test.sh installs it; Debian: apt-get install stress-ng): %v", err)
	}
	cmd := exec.Command(bin, "--cpu", strconv.Itoa(n), "--timeout", "60s", "--quiet")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its workers in a group of their own, ended with it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group this test started
		<-done
	})
	// Its workers are its children: wait until n of them are running.
	children := fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(children)
		if err == nil && len(strings.Fields(string(b))) >= n {
			return
		}
		select {
		case <-done:
			t.Fatalf("stress-ng exited at once: %v", cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("stress-ng's %d workers are not running after 10 s (%s: %q %v)", n, children, b, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the process table; nothing to wait on
	}
}

// TestServeE2EBusyMachine: a healthy Redis on a busy machine is not a dead one. `sluice serve` on
// a real redis-server, with the store's default timeouts (fail-closed), beside stress-ng loading
// both cores: 2,000 requests at 200 a second, each from an address of its own (2,000 keys, one
// decision on Redis each). Every request is answered, and none 503: a store call that a busy
// machine makes late waits for its reply up to store.slow_timeout, and only a Redis that answers
// nothing at all opens the breaker. (Before, calls timed out at 50 ms, three in a row opened the
// breaker, and fail-closed answered 503 for its cooldown: 153 and 578 of 2,000 on a loaded
// machine.)
func TestServeE2EBusyMachine(t *testing.T) {
	const requests, rate = 2000, 200
	rs := redistest.Start(t)
	up := newUpstream(t)
	up.slow = 0
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
identity:
  - ip: {trusted_proxies: [127.0.0.1/32]}
policies:
  - {name: anon, algorithm: fixed-window, limit: 10, period: 1m}
default_policy: anon
`, listen, admin, up.URL, rs.Addr)
	})
	busyCPU(t, 2)

	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}}
	defer client.CloseIdleConnections()
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		failed   []string
		slowest  time.Duration
		wg       sync.WaitGroup
	)
	start := time.Now()
	for i := range requests {
		// Open loop: request i goes at i/rate s, late requests at once.
		if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
			time.Sleep(d) // the pacing of the load is the subject
		}
		wg.Go(func() {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, p.proxy+"/busy", nil)
			if err != nil {
				panic(err)
			}
			req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
			began := time.Now()
			resp, err := client.Do(req)
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, took)
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			resp.Body.Close()
			statuses[resp.StatusCode]++
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	errs := p.metric(t, "sluice_store_errors_total", nil)
	t.Logf("%d requests in %v beside stress-ng --cpu 2: statuses %v, %d unanswered, slowest %v; store errors %v",
		requests, elapsed.Round(time.Millisecond), statuses, len(failed), slowest.Round(time.Millisecond), errs)
	if len(failed) > 0 {
		t.Errorf("%d requests were not answered, e.g. %s", len(failed), failed[0])
	}
	if n := statuses[http.StatusServiceUnavailable]; n > 0 {
		t.Errorf("%d of %d requests answered 503 with Redis healthy: a busy machine was taken for a dead Redis", n, requests)
	}
	if statuses[http.StatusOK] != requests-len(failed) {
		t.Errorf("statuses %v; want %d × 200 (one request per address, a limit of 10)", statuses, requests)
	}
}
