package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/llmtest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// slowSettleBody is the LLM request of these tests: "hello", 2 tokens of prompt, plus max_tokens,
// an estimate of 1,002; streamed, with its usage at the end.
const slowSettleBody = `{"model":"gpt-small","max_tokens":1000,"messages":[{"role":"user","content":"hello"}],"stream":true,"stream_options":{"include_usage":true}}`

// settlementPending starts sluice on Redis (a store timeout of 200 ms) in front of the fake LLM
// API, and runs a stream whose usage, 4,750 tokens, exceeds its estimate, 1,002, ending it while
// Redis takes no writes (CLIENT PAUSE WRITE for pause, from after the stream's first event): it
// returns once sluice says the settlement is pending; unpause resumes Redis before the pause ends
// (and is done at the test's end otherwise).
func settlementPending(t *testing.T, pause time.Duration) (p *sluiceProc, rs *redistest.Server, unpause func()) {
	up := llmtest.Start(t)
	rs = redistest.Start(t)
	p = startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store: {type: redis, addrs: [%s], timeout: 200ms}
identity:
  - api_key: {header: Authorization}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 5000, period: 1000h}
clients:
  - {name: team, api_key_sha256: %q, policy: tpm}
routes:
  - path_prefix: /v1/chat/completions
    usage: {format: openai}
`, listen, admin, up.URL, rs.Addr, sha256Hex(llmKey("team")))
	})
	resp := llmPost(t, p.proxy, "/v1/chat/completions", slowSettleBody, "team", "Authorization",
		"X-Test-Usage", "input=750,output=4000", "X-Test-Events", "20", "X-Test-Interval", "10ms")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the stream: %d %s", resp.StatusCode, readAll(t, resp))
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // decided and charged: the stream has begun
		t.Fatal(err)
	}
	if got := windowCount(t, rs, "rate-limit:{team}:tpm:v2"); got != 1002 {
		t.Fatalf("Redis counts %d tokens while the stream runs, want the estimate, 1002", got)
	}
	if _, err := rs.Do("CLIENT", "PAUSE", strconv.FormatInt(pause.Milliseconds(), 10), "WRITE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unpause = func() {
		once.Do(func() {
			if _, err := rs.Do("CLIENT", "UNPAUSE"); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(unpause)
	if _, err := io.Copy(io.Discard, r); err != nil { // the stream's end: its usage, then the settlement
		t.Fatal(err)
	}
	resp.Body.Close()
	p.waitMetric(t, "sluice_settlements_pending", nil, 1, 20*time.Second)
	return p, rs, unpause
}

// TestServeE2ESettlementLandsAfterSlowRedis: `sluice serve` on Redis in front of the fake LLM API.
// A stream whose usage (4,750 tokens) exceeds its estimate (1,002) ends while Redis takes no
// writes (CLIENT PAUSE WRITE: its settlement's script waits past the store's 200 ms, as behind a
// slow fsync), so the settlement cannot be confirmed: it is pending (the metric and /v1/stats say
// 1), not dropped. Once Redis takes writes again it lands, applied once however many attempts
// were queued behind the pause: Redis counts exactly 4,750 tokens, the next request (another
// estimate of 1,002 against the 250 left) is refused, nothing is pending and nothing was lost.
// Before settlements were retried, 1,002 stood and the next request was admitted.
func TestServeE2ESettlementLandsAfterSlowRedis(t *testing.T) {
	t.Parallel()
	p, rs, unpause := settlementPending(t, time.Minute)
	if st := p.stats(t).Store.Settlements; st.Pending != 1 || st.Lost() != 0 {
		t.Fatalf("/v1/stats while Redis takes no writes: %+v, want 1 pending", st)
	}
	if got := windowCount(t, rs, "rate-limit:{team}:tpm:v2"); got != 1002 {
		t.Fatalf("Redis counts %d tokens while paused, want 1002", got)
	}
	unpause()
	deadline := time.Now().Add(30 * time.Second)
	for p.metric(t, "sluice_settlements_pending", nil) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the settlement never landed: %+v\nstderr:\n%s", p.stats(t).Store.Settlements, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := windowCount(t, rs, "rate-limit:{team}:tpm:v2"); got != 4750 {
		t.Fatalf("Redis counts %d tokens once the settlement landed, want 4750 (the usage, once)", got)
	}
	if lost := p.metric(t, "sluice_settlements_lost_total", nil); lost != 0 {
		t.Fatalf("sluice_settlements_lost_total = %v, want 0", lost)
	}
	if st := p.stats(t).Store.Settlements; st.Pending != 0 || st.Landed != 1 || st.Lost() != 0 {
		t.Fatalf("/v1/stats once landed: %+v, want 1 landed, nothing pending or lost", st)
	}
	if got := balanceOf(t, p, "team", "tpm"); got != 250 {
		t.Fatalf("team has %d tokens left, want 250", got)
	}
	next := llmPost(t, p.proxy, "/v1/chat/completions", slowSettleBody, "team", "Authorization")
	b := readAll(t, next)
	if _, err := llmRefusal(next, b, false, "tpm"); err != nil {
		t.Fatalf("the next request, an estimate of 1,002 against 250 left: %v", err)
	}
	// The settlement's record, in the key's slot, outlives the retries (10 minutes) and more.
	keys, err := rs.Do("KEYS", "rate-limit:{team}:settled:*")
	if err != nil || keys == "" {
		t.Fatalf("the settlement's id record: %q %v", keys, err)
	}
}

// TestServeE2ESettlementsDrainedAtShutdown: a settlement still pending when sluice is told to stop
// (SIGTERM) is landed before the store closes. Redis takes no writes for 6 s, and sluice is
// stopped as soon as the settlement is pending: it says it is landing it, waits (up to
// server.drain_timeout) until Redis takes writes again, and exits cleanly with the usage charged
// once and nothing lost. Closing the store at once would leave the estimate, 1,002.
func TestServeE2ESettlementsDrainedAtShutdown(t *testing.T) {
	t.Parallel()
	p, rs, _ := settlementPending(t, 6*time.Second)
	p.signal(syscall.SIGTERM)
	if code := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d\nstderr:\n%s", code, p.stderr.String())
	}
	if got := windowCount(t, rs, "rate-limit:{team}:tpm:v2"); got != 4750 {
		t.Fatalf("Redis counts %d tokens after the shutdown, want 4750 (the usage, once)", got)
	}
	if !strings.Contains(p.stderr.String(), "landing the settlements still pending") || strings.Contains(p.stderr.String(), "settlements lost") {
		t.Fatalf("sluice should have said it was landing the pending settlement, and lost none\nstderr:\n%s", p.stderr.String())
	}
}
