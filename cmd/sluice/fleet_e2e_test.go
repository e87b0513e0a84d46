package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The API keys of the fleet test's two clients (only their SHA-256 is configured).
const (
	fleetKeyA = "e2e-fleet-a-key-51d9e2"
	fleetKeyB = "e2e-fleet-b-key-0c7a44"
)

// fleetConfig: on_error local with the default local_share (fleet); two clients, each with a
// fixed window of 31 per 1000 hours (a window that cannot roll over during the test). fleet is
// the store's fleet line ("": none, the default fleet).
func fleetConfig(upstreamURL, redisAddr, fleet string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  on_error: local
  timeout: 1s
  %s
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: fleet-window, algorithm: fixed-window, limit: 31, period: 1000h}
clients:
  - {name: fleet-a, api_key_sha256: %q, policy: fleet-window}
  - {name: fleet-b, api_key_sha256: %q, policy: fleet-window}
`, listen, admin, upstreamURL, redisAddr, fleet, sha256Hex(fleetKeyA), sha256Hex(fleetKeyB))
	}
}

// statsFleet reads the fleet of p's GET /v1/stats.
func statsFleet(t *testing.T, p *sluiceProc) *gateway.FleetStats {
	t.Helper()
	r := get(t, p.admin, "/v1/stats")
	var st gateway.Stats
	if err := json.Unmarshal(r.body, &st); err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /v1/stats of %s: %d %v %s", p.admin, r.status, err, r.body)
	}
	if st.Fleet == nil {
		t.Fatalf("GET /v1/stats of %s has no fleet (on_error: local, local_share: fleet): %s", p.admin, r.body)
	}
	return st.Fleet
}

// waitFleet waits until every one of procs sees n live instances at a heartbeat answered after
// since, and returns what each shows.
func waitFleet(t *testing.T, procs []*sluiceProc, n int, since time.Time, within time.Duration) []*gateway.FleetStats {
	t.Helper()
	out := make([]*gateway.FleetStats, len(procs))
	deadline := time.Now().Add(within)
	fresh := func(f *gateway.FleetStats) bool { return f.Instances == n && f.SeenAt != nil && f.SeenAt.After(since) }
	for i, p := range procs {
		for out[i] = statsFleet(t, p); !fresh(out[i]); out[i] = statsFleet(t, p) {
			if time.Now().After(deadline) {
				t.Fatalf("instance %d never saw %d live instances within %v: %+v", i, n, within, out[i])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// admitted sends n requests of the client with key to p and returns how many were let through
// (200); every other answer must be a 429.
func admitted(t *testing.T, p *sluiceProc, path, key string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		switch r := get(t, p.proxy, path, "X-API-Key", key); r.status {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("%s of %s: %d %s; want 200 or 429", path, p.proxy, r.status, r.body)
		}
	}
	return ok
}

// TestServeE2EFleetShare: three `sluice serve` processes on one Redis, with on_error: local and
// the default local_share (fleet), register in its instance registry and see three live
// instances (/v1/stats lists them and says the fallback's share, 1/3; sluice_fleet_instances
// is 3). A fourth process on the same Redis is another gateway (store.fleet: llm): it sees
// itself alone, and the three do not count it (they name no fleet: the default fleet, whose
// registry is the one of before names). Redis is killed: each of the three then admits exactly
// floor(31/3) = 10 of one client's requests on its own — 30 in all, not 3 × 31 — still counting
// the three it last saw, and the llm one all 31 (its share 1/1; as one fleet of four each would
// admit 7). Redis
// comes back; one process is killed (SIGKILL: it never leaves the registry), and once its
// heartbeat's TTL has passed the other two see two instances. Redis is killed again: each of the
// two admits exactly floor(31/2) = 15 of another client's requests, the count it last saw.
func TestServeE2EFleetShare(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	llm := startSluice(t, t.TempDir(), "llm.yaml", fleetConfig(up.URL, rs.Addr, "fleet: llm"))
	waitFleet(t, []*sluiceProc{llm}, 1, time.Time{}, 20*time.Second) // registered before the others start
	procs := startThree(t, fleetConfig(up.URL, rs.Addr, ""))

	seen := waitFleet(t, procs, 3, time.Time{}, 20*time.Second)
	var selves []string
	for _, f := range seen {
		selves = append(selves, f.Self)
	}
	slices.Sort(selves)
	if len(slices.Compact(slices.Clone(selves))) != 3 {
		t.Fatalf("the instances' ids are not distinct: %v", selves)
	}
	for i, f := range seen {
		var members []string
		for _, m := range f.Members {
			members = append(members, m.ID)
		}
		slices.Sort(members)
		if !slices.Equal(members, selves) || f.FallbackShare != 1.0/3 || f.SeenAt == nil || f.Error != "" {
			t.Errorf("instance %d's fleet: %+v; want members %v, share 1/3", i, f, selves)
		}
		if v := procs[i].metric(t, "sluice_fleet_instances", nil); v != 3 {
			t.Errorf("instance %d: sluice_fleet_instances %v; want 3", i, v)
		}
		if v := procs[i].metric(t, "sluice_fleet_info", map[string]string{"fleet": "default"}); f.Name != "default" || v != 1 {
			t.Errorf("instance %d's fleet is named %q (sluice_fleet_info{fleet=default} %v); want default (1)", i, f.Name, v)
		}
	}
	// The llm gateway, at a heartbeat after the three registered: itself alone, in its /v1/stats
	// fleet, its diagnosis and its metrics.
	lf := waitFleet(t, []*sluiceProc{llm}, 1, time.Now(), 20*time.Second)[0]
	var llmStats gateway.Stats
	if r := get(t, llm.admin, "/v1/stats"); json.Unmarshal(r.body, &llmStats) != nil || llmStats.Diagnosis.Counting.Instances != 1 {
		t.Errorf("the llm gateway's diagnosis counts %d instances; want 1: %s", llmStats.Diagnosis.Counting.Instances, r.body)
	}
	if lf.Name != "llm" || len(lf.Members) != 1 || lf.Members[0].ID != lf.Self || slices.Contains(selves, lf.Self) || lf.FallbackShare != 1 {
		t.Errorf("the llm gateway's fleet: %+v; want llm, itself alone, share 1", lf)
	}
	if v := llm.metric(t, "sluice_fleet_info", map[string]string{"fleet": "llm"}); v != 1 || llm.metric(t, "sluice_fleet_instances", nil) != 1 {
		t.Errorf("the llm gateway: sluice_fleet_info{fleet=llm} %v, sluice_fleet_instances %v; want 1, 1", v, llm.metric(t, "sluice_fleet_instances", nil))
	}

	rs.Kill()
	const pathA = "/fleet-a/orders"
	for i, p := range procs {
		if n := admitted(t, p, pathA, fleetKeyA, 15); n != 10 {
			t.Errorf("instance %d with Redis down: admitted %d of 15; want floor(31/3) = 10", i, n)
		}
	}
	if got := up.count(pathA); got != 30 {
		t.Errorf("the upstream received %d of fleet-a's requests with Redis down; want 3 × 10 = 30", got)
	}
	if n := admitted(t, llm, "/llm/orders", fleetKeyA, 40); n != 31 {
		t.Errorf("the llm gateway with Redis down: admitted %d of 40; want its whole share, 31 (1/1)", n)
	}
	// The next heartbeat fails, and the count stays.
	for i, p := range procs {
		deadline := time.Now().Add(10 * time.Second)
		f := statsFleet(t, p)
		for ; f.Error == "" && time.Now().Before(deadline); f = statsFleet(t, p) {
			time.Sleep(50 * time.Millisecond)
		}
		if f.Instances != 3 || f.FallbackShare != 1.0/3 || f.Error == "" {
			t.Errorf("instance %d's fleet with Redis down: %+v; want the heartbeat's error and the last count, 3", i, f)
		}
	}

	// Redis back (empty): the three register again. Then one dies without leaving.
	restarted := time.Now()
	rs.Restart()
	waitFleet(t, procs, 3, restarted, 20*time.Second)
	if err := procs[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-procs[2].done
	killed := time.Now()
	rest := procs[:2]
	waitFleet(t, rest, 2, killed, 30*time.Second)
	t.Logf("the survivors saw 2 instances %v after the kill (TTL 10 s)", time.Since(killed).Round(100*time.Millisecond))
	for i, p := range rest {
		if v := p.metric(t, "sluice_fleet_instances", nil); v != 2 {
			t.Errorf("instance %d: sluice_fleet_instances %v after the kill; want 2", i, v)
		}
	}

	rs.Kill()
	const pathB = "/fleet-b/orders"
	for i, p := range rest {
		if n := admitted(t, p, pathB, fleetKeyB, 20); n != 15 {
			t.Errorf("instance %d with Redis down again: admitted %d of 20; want floor(31/2) = 15", i, n)
		}
	}
	if got := up.count(pathB); got != 30 {
		t.Errorf("the upstream received %d of fleet-b's requests with Redis down again; want 2 × 15 = 30", got)
	}
}
