package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServeE2EBodyMemory: fifty valid chat requests of 3.9 MB each, sent at once to a usage route
// of a sluice (built without -race, so that its memory is its own) on a real Redis, hold at most
// server.body_memory of bodies at once: the process's peak RSS stays under 400 MiB, its heap is
// back under 64 MiB within three minutes (the runtime's forced collection comes within two),
// every request is answered — 200, or 503 with Retry-After in OpenAI's shape when its body did
// not fit in time — and a client on a plain route, asking all the while, never sees a 5xx: the
// bodies take nothing from it, nor from the store's calls.
func TestServeE2EBodyMemory(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	// The upstream reads each body and answers a chat completion with its usage. (Not llmtest's:
	// it parses every body, which under -race would be most of what the test measures.)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":975000,"completion_tokens":1,"total_tokens":975001}}`)
	}))
	t.Cleanup(up.Close)
	cfg := func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store: {type: redis, addrs: [%s]}
identity:
  - api_key: {header: Authorization}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 1000000000, period: 1000h}
  - {name: plain, algorithm: fixed-window, limit: 1000000, period: 1000h}
clients:
  - {name: team, api_key_sha256: %q, policy: tpm}
  - {name: bystander, api_key_sha256: %q, policy: plain}
routes:
  - path_prefix: /v1/chat/completions
    usage: {format: openai}
`, listen, admin, up.URL, rs.Addr, sha256Hex(llmKey("team")), sha256Hex(llmKey("bystander")))
	}
	p, err := launchWith(t, t.TempDir(), "sluice.yaml", cfg, "/readyz", launchOpts{bin: plainBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	// A chat request of 3.9 MB: one message of that much text (with escapes, as JSON has them).
	text := strings.Repeat(`The quick brown fox \"jumps\" over the lazy dog.\n `, 3_900_000/52)
	body := `{"model":"gpt-test","max_tokens":100,"messages":[{"role":"user","content":"` + text + `"}]}`
	if n := len(body); n < 3_800_000 || n > 4<<20 {
		t.Fatalf("the body is %d bytes; want about 3.9 MB, under max_body", n)
	}

	stop := make(chan struct{})
	var bystander sync.WaitGroup
	var asked, failed atomic.Int64
	var firstFailure atomic.Value
	bystander.Add(1)
	go func() { // the bystander asks on a plain route all the while
		defer bystander.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := tryLLMGet(p.proxy, "/v1/models", "bystander")
			asked.Add(1)
			if err != nil || resp.StatusCode >= 500 {
				failed.Add(1)
				what := fmt.Sprint(err)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					what = fmt.Sprintf("%d %s", resp.StatusCode, b)
				}
				firstFailure.CompareAndSwap(nil, what)
			}
			if resp != nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()

	const n = 50
	statuses := make([]int, n)
	problems := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := tryLLMPost(p.proxy, "/v1/chat/completions", body, "team", "Authorization")
			if err != nil {
				problems[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			statuses[i] = resp.StatusCode
			if resp.StatusCode == http.StatusServiceUnavailable {
				var e struct {
					Error struct{ Type, Message string }
				}
				if json.Unmarshal(b, &e) != nil || e.Error.Type != "server_error" || resp.Header.Get("Retry-After") == "" ||
					!strings.Contains(e.Error.Message, "server.body_memory") {
					problems[i] = fmt.Sprintf("503 not for body memory in OpenAI's shape with Retry-After: %v %s", resp.Header, b)
				}
			} else if resp.StatusCode != http.StatusOK {
				problems[i] = fmt.Sprintf("%d %s", resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	peak := procStatusKiB(t, p, "VmHWM")
	close(stop)
	bystander.Wait()

	ok, refused := 0, 0
	for i, s := range statuses {
		switch {
		case problems[i] != "":
			t.Errorf("request %d: %s", i, problems[i])
		case s == http.StatusOK:
			ok++
		default:
			refused++
		}
	}
	t.Logf("50 bodies of %.1f MB at once: %d answered 200, %d refused 503 (body memory full); peak RSS %d MiB; the bystander asked %d times",
		float64(len(body))/1e6, ok, refused, peak>>10, asked.Load())
	if ok == 0 {
		t.Errorf("no request of the fifty was forwarded")
	}
	if peak > 400<<10 {
		t.Errorf("peak RSS %d MiB, want under 400 MiB", peak>>10)
	}
	if f := failed.Load(); f > 0 || asked.Load() == 0 {
		t.Errorf("the bystander on a plain route: %d of %d requests failed or 5xx (first: %v), want none", f, asked.Load(), firstFailure.Load())
	}
	// The heap: back under 64 MiB once the runtime has collected (at the latest its forced
	// collection, every two minutes).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		heap := p.metric(t, "go_memstats_heap_alloc_bytes", nil)
		if heap < 64<<20 {
			t.Logf("heap %.1f MiB after the burst", heap/(1<<20))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heap holds %.0f MiB three minutes after the burst, want under 64 MiB", heap/(1<<20))
		}
		time.Sleep(time.Second) // (polling the process's own metric)
	}
	if v := p.metric(t, "sluice_body_memory_bytes", nil); v != 0 {
		t.Errorf("sluice_body_memory_bytes = %v after every request ended, want 0", v)
	}
}

// tryLLMGet is a GET of base+path as client (its key as a bearer token).
func tryLLMGet(base, path, client string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+llmKey(client))
	return llmHTTP.Do(req)
}

// procStatusKiB reads a field of the process's /proc/PID/status, in KiB (VmHWM: its peak RSS).
func procStatusKiB(t *testing.T, p *sluiceProc, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, p.cmd.Process.Pid)
	return 0
}
