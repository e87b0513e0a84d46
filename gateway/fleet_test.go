package gateway_test

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFleetStats: two gateways on one Redis with on_error: local (local_share: fleet, the
// default) register in its instance registry; /v1/stats and the metrics of each show both
// instances and the fallback's share, 1/2; with Redis killed they keep that count and each
// admits exactly half of a fixed window of 11 (5) locally. With a fixed local_share the registry
// runs too (every Redis store runs it), and the stats say the fixed share.
func TestFleetStats(t *testing.T) {
	rs := redistest.Start(t)
	up := newUpstream(t)
	yaml := `
upstream: UPSTREAM
store: {type: redis, addrs: [` + rs.Addr + `], on_error: local, timeout: 500ms}
identity:
  - ip: {}
policies:
  - {name: anonymous, algorithm: fixed-window, limit: 11, period: 1000h}
default_policy: anonymous
`
	gws := make([]string, 2)
	admins := make([]string, 2)
	for i := range gws {
		gw, srv := start(t, "fasthttp", yaml, up)
		gws[i], admins[i] = gw.URL, httptestServer(t, srv)
	}
	var sts [2]gateway.Stats
	deadline := time.Now().Add(15 * time.Second)
	for i := range admins {
		for sts[i] = stats(t, admins[i]); sts[i].Fleet == nil || sts[i].Fleet.Instances != 2; sts[i] = stats(t, admins[i]) {
			if time.Now().After(deadline) {
				t.Fatalf("gateway %d never saw 2 instances: %+v", i, sts[i].Fleet)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i, st := range sts {
		f := st.Fleet
		var members []string
		for _, m := range f.Members {
			members = append(members, m.ID)
			if m.LastSeen.IsZero() || time.Since(m.LastSeen) > time.Minute {
				t.Errorf("gateway %d: member %s last seen %v; want a recent heartbeat", i, m.ID, m.LastSeen)
			}
		}
		slices.Sort(members)
		want := []string{sts[0].Fleet.Self, sts[1].Fleet.Self}
		slices.Sort(want)
		if f.FallbackShare != 0.5 || !slices.Equal(members, want) || want[0] == want[1] || f.SeenAt == nil || f.Error != "" {
			t.Errorf("gateway %d: fleet %+v; want share 0.5 and members %v", i, f, want)
		}
		if v := metricValue(t, admins[i], "sluice_fleet_instances"); v != "2" {
			t.Errorf("gateway %d: sluice_fleet_instances %s; want 2", i, v)
		}
		if v := metricValue(t, admins[i], "sluice_fallback_share"); v != "0.5" {
			t.Errorf("gateway %d: sluice_fallback_share %s; want 0.5", i, v)
		}
	}
	resp, err := http.Get(admins[0] + "/operator/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `id="fleet-members"`) {
		t.Errorf("the operator page has no instances table")
	}

	rs.Kill()
	for i, gw := range gws {
		allowed := 0
		for range 12 {
			switch r := get(t, gw+"/x"); r.StatusCode {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("gateway %d with Redis down: %d", i, r.StatusCode)
			}
		}
		if allowed != 5 {
			t.Errorf("gateway %d with Redis down: %d of 12 admitted locally; want floor(11/2) = 5", i, allowed)
		}
	}
	if f := stats(t, admins[0]).Fleet; f == nil || f.Instances != 2 || f.FallbackShare != 0.5 {
		t.Errorf("with Redis down, the stats' fleet %+v; want the last count, 2", f)
	}

	// A fixed share runs the registry too (every Redis store does), and says its own share.
	rs.Restart()
	fixed := strings.Replace(yaml, "on_error: local,", "on_error: local, local_share: 0.5,", 1)
	_, srv := start(t, "fasthttp", fixed, up)
	admin := httptestServer(t, srv)
	deadline = time.Now().Add(15 * time.Second)
	f := stats(t, admin).Fleet
	for ; f == nil || f.Instances == 0; f = stats(t, admin).Fleet {
		if time.Now().After(deadline) {
			t.Fatalf("local_share 0.5: no registry in the stats within 15 s: %+v", f)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if f.FallbackShare != 0.5 {
		t.Errorf("local_share 0.5: fleet %+v; want the fixed share, 0.5", f)
	}
	if v := metricValue(t, admin, "sluice_fallback_share"); v != "0.5" {
		t.Errorf("local_share 0.5: sluice_fallback_share %s; want 0.5", v)
	}
}

func metricsText(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestFleetNames: an API gateway (fleet api, two instances) and an LLM gateway (fleet llm, one
// instance) share one Redis but not a configuration (each its own policy). Requests reach the
// three at once. Each counts only its own fleet: /v1/stats says its name, 2 or 1 instances, only
// its members, the fallback's share 1/2 or 1/1, sluice_fleet_info{fleet} and
// sluice_fleet_instances say the same, and the diagnosis (its instance count, its shares) holds
// only its fleet's instances and policy. With Redis killed, each api instance admits exactly
// floor(11/2) = 5 locally and the llm one all 11 — as a single fleet of three they would admit 3
// each.
func TestFleetNames(t *testing.T) {
	rs := redistest.Start(t)
	up := newUpstream(t)
	fleetYAML := func(fleet string) string {
		return `
upstream: UPSTREAM
store: {type: redis, addrs: [` + rs.Addr + `], on_error: local, timeout: 500ms, fleet: ` + fleet + `}
identity:
  - ip: {}
policies:
  - {name: ` + fleet + `-window, algorithm: fixed-window, limit: 11, period: 1000h}
default_policy: ` + fleet + `-window
`
	}
	type instance struct{ fleet, gw, admin string }
	var insts []instance
	for _, fleet := range []string{"api", "api", "llm"} {
		gw, srv := start(t, "fasthttp", fleetYAML(fleet), up)
		insts = append(insts, instance{fleet, gw.URL, httptestServer(t, srv)})
	}
	sent := map[string]int64{"api": 6, "llm": 3} // 3 to each instance
	var wg sync.WaitGroup
	for _, in := range insts {
		for range 3 {
			wg.Go(func() {
				if r := get(t, in.gw+"/x"); r.StatusCode != http.StatusOK {
					t.Errorf("%s: %d; want 200 (Redis up, within the limit)", in.gw, r.StatusCode)
				}
			})
		}
	}
	wg.Wait()

	wantMembers := map[string]int{"api": 2, "llm": 1}
	selves := map[string][]string{}
	sts := make([]gateway.Stats, len(insts))
	deadline := time.Now().Add(20 * time.Second)
	for i, in := range insts {
		// Until the heartbeats have carried every instance's approvals: the fleet's total.
		done := func(st gateway.Stats) bool {
			sh := st.Diagnosis.Shares
			return st.Fleet != nil && st.Fleet.Instances == wantMembers[in.fleet] && sh != nil && len(sh.Clients) == 1 && sh.Clients[0].Total == sent[in.fleet]
		}
		for sts[i] = stats(t, in.admin); !done(sts[i]); sts[i] = stats(t, in.admin) {
			if time.Now().After(deadline) {
				t.Fatalf("instance %d (%s) never saw its fleet's %d instances and %d approvals: fleet %+v, shares %+v",
					i, in.fleet, wantMembers[in.fleet], sent[in.fleet], sts[i].Fleet, sts[i].Diagnosis.Shares)
			}
			time.Sleep(50 * time.Millisecond)
		}
		selves[in.fleet] = append(selves[in.fleet], sts[i].Fleet.Self)
	}
	for i, in := range insts {
		f, d := sts[i].Fleet, sts[i].Diagnosis
		want := slices.Sorted(slices.Values(selves[in.fleet]))
		var members []string
		for _, m := range f.Members {
			members = append(members, m.ID)
		}
		slices.Sort(members)
		if f.Name != in.fleet || !slices.Equal(members, want) || f.FallbackShare != 1/float64(len(want)) {
			t.Errorf("instance %d (%s): fleet %+v; want name %s, members %v, share 1/%d", i, in.fleet, f, in.fleet, want, len(want))
		}
		if d.Counting.Instances != len(want) || d.Shares.Instances != len(want) || d.Shares.Listed != len(want) {
			t.Errorf("instance %d (%s): the diagnosis counts %d instances, its shares %d (%d listed); want %d",
				i, in.fleet, d.Counting.Instances, d.Shares.Instances, d.Shares.Listed, len(want))
		}
		c := d.Shares.Clients[0]
		var shareIDs []string
		for _, s := range c.Instances {
			shareIDs = append(shareIDs, s.ID)
		}
		slices.Sort(shareIDs)
		if c.Policy != in.fleet+"-window" || !slices.Equal(shareIDs, want) {
			t.Errorf("instance %d (%s): the diagnosis's share %+v; want policy %s-window on %v only", i, in.fleet, c, in.fleet, want)
		}
		if v := metricValue(t, in.admin, `sluice_fleet_info\{fleet="`+in.fleet+`"\}`); v != "1" {
			t.Errorf("instance %d: sluice_fleet_info{fleet=%q} %s; want 1", i, in.fleet, v)
		}
		if v := metricValue(t, in.admin, "sluice_fleet_instances"); v != strconv.Itoa(len(want)) {
			t.Errorf("instance %d (%s): sluice_fleet_instances %s; want %d", i, in.fleet, v, len(want))
		}
	}

	rs.Kill()
	for i, in := range insts {
		allowed := 0
		for range 12 {
			switch r := get(t, in.gw+"/y"); r.StatusCode {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("instance %d with Redis down: %d", i, r.StatusCode)
			}
		}
		if want := 11 / wantMembers[in.fleet]; allowed != want {
			t.Errorf("instance %d (%s) with Redis down: %d of 12 admitted locally; want floor(11/%d) = %d", i, in.fleet, allowed, wantMembers[in.fleet], want)
		}
	}
}

// TestFleetNameReload: store.fleet changes at a restart only (like the rest of the store): a
// reload that changes it is refused, and the instance stays in the fleet it started in.
func TestFleetNameReload(t *testing.T) {
	rs := redistest.Start(t)
	up := newUpstream(t)
	yaml := func(fleet string) string {
		return "upstream: UPSTREAM\nstore: {type: redis, addrs: [" + rs.Addr + "], fleet: " + fleet + "}\n"
	}
	srv, reload := reloadable(t, up, yaml("api"))
	admin := httptestServer(t, srv)
	if err := reload(yaml("llm")); !errors.Is(err, gateway.ErrStoreChanged) {
		t.Errorf("a reload changing store.fleet: %v; want ErrStoreChanged", err)
	}
	if f := stats(t, admin).Fleet; f == nil || f.Name != "api" || srv.Config().Store.Fleet != "api" {
		t.Errorf("after the refused reload: fleet %+v, configuration's %q; want api", f, srv.Config().Store.Fleet)
	}
	if v := metricValue(t, admin, `sluice_fleet_info\{fleet="api"\}`); v != "1" {
		t.Errorf("after the refused reload: sluice_fleet_info{fleet=api} %s; want 1", v)
	}
}
