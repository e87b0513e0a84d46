package gateway_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// GET /v1/history on the memory store: after two minutes of traffic on the virtual clock, folded
// every 10 s, the last hour's slots hold what was decided in each (busy's refusals named), the
// fleet is null (the fleet is this instance), and ?window=30s gives the last three slots. Bad
// query parameters are 400 problems naming the parameter.
func TestHistoryEndpoint(t *testing.T) {
	srv, clock, admin := clockedServer(t, nil)
	for s := 0; s < 120; s++ {
		clock.Set(needsStart.Add(time.Duration(s) * time.Second))
		decideAs(t, srv, "steady", "")
		for i := 0; i < 3; i++ {
			decideAs(t, srv, "busy", "") // 100 a minute: 180 offered, 80 refused a minute
		}
		if s%10 == 0 {
			gateway.FoldHistory(srv)
		}
	}
	clock.Set(needsStart.Add(121 * time.Second))
	var h gateway.HistoryReport
	if code, detail := getJSON(t, admin+"/v1/history", &h); code != 200 {
		t.Fatalf("GET /v1/history: %d %s", code, detail)
	}
	if h.ResolutionSeconds != 10 || h.WindowSeconds != 3600 || h.Fleet != nil || len(h.Instance) != 12 {
		t.Fatalf("history: resolution %d s, window %d s, fleet %v, %d slots; want 10, 3600, none, 12", h.ResolutionSeconds, h.WindowSeconds, h.Fleet, len(h.Instance))
	}
	var allowed, refused uint64
	for i, s := range h.Instance {
		if !s.Start.Equal(needsStart.Add(time.Duration(i)*10*time.Second)) || s.Allowed+s.Refused != 40 || s.Delayed != 0 {
			t.Fatalf("slot %d: %+v; want 40 decided at %v", i, s, needsStart.Add(time.Duration(i)*10*time.Second))
		}
		if s.Refused > 0 && (len(s.TopRefused) != 1 || s.TopRefused[0] != gateway.ClientRefused{Client: "busy", Refused: s.Refused}) {
			t.Fatalf("slot %d's most refused: %+v; want busy's %d", i, s.TopRefused, s.Refused)
		}
		allowed += s.Allowed
		refused += s.Refused
	}
	if allowed != 2*(60+100) || refused != 2*80 {
		t.Fatalf("the slots' allowed %d, refused %d; want %d and %d", allowed, refused, 2*160, 2*80)
	}
	if code, detail := getJSON(t, admin+"/v1/history?window=30s", &h); code != 200 || len(h.Instance) != 3 || h.WindowSeconds != 30 ||
		!h.Instance[0].Start.Equal(needsStart.Add(90*time.Second)) {
		t.Fatalf("?window=30s: %d %s, %d slots from %v", code, detail, len(h.Instance), h.Instance[0].Start)
	}
	for q, field := range map[string]string{"window=2h": "window", "window=15s": "window", "window=soon": "window", "window=1m&window=2m": "window",
		"since=1h": `query parameter "since"`} {
		code, detail := getJSON(t, admin+"/v1/history?"+q, &h)
		if code != 400 || !strings.HasPrefix(detail, field+":") {
			t.Errorf("?%s: %d %q; want 400 naming %s", q, code, detail, field)
		}
	}
}

// fleetServer starts a gateway on the Redis at addr, with clients alpha and beta of a policy of
// 5 per 1000 h.
func fleetServer(t *testing.T, addr string) *gateway.Server {
	t.Helper()
	yaml := `
listen: ""
store: {type: redis, addrs: [` + addr + `], timeout: 2s}
policies:
  - {name: tight, algorithm: fixed-window, limit: 5, period: 1000h}
default_policy: tight
clients:
  - {name: alpha, api_key_sha256: ` + strings.Repeat("a", 64) + `, policy: tight}
  - {name: beta, api_key_sha256: ` + strings.Repeat("b", 64) + `, policy: tight}
`
	cfg, err := config.Parse([]byte(yaml), "fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// fleetGateway is fleetServer on clock, and its admin listener's URL.
func fleetGateway(t *testing.T, addr string, clock *sluice.ManualClock) (*gateway.Server, string) {
	t.Helper()
	srv := fleetServer(t, addr)
	srv.SetClock(clock.Now)
	return srv, httptestServer(t, srv)
}

// readHistory is GET /v1/history of admin.
func readHistory(t *testing.T, admin string) gateway.HistoryReport {
	t.Helper()
	var rep gateway.HistoryReport
	if code, detail := getJSON(t, admin+"/v1/history", &rep); code != 200 {
		t.Fatalf("GET /v1/history: %d %s", code, detail)
	}
	return rep
}

// slotsText is slots as "start allowed/refused/delayed [most refused] xinstances; ...".
func slotsText(slots []gateway.HistorySlot) string {
	var out []string
	for _, s := range slots {
		out = append(out, fmt.Sprintf("%s %d/%d/%d %v x%d", s.Start.Format("15:04:05"), s.Allowed, s.Refused, s.Delayed, s.TopRefused, s.Instances))
	}
	return strings.Join(out, "; ")
}

// TestFleetHistoryEndpoint: two gateways on one real Redis, on one virtual clock: each folds its
// slot and adds it to the fleet's; GET /v1/history of either has its own slot as "instance" and
// the sum of both as "fleet", with the most refused clients of both, and the two instances.
func TestFleetHistoryEndpoint(t *testing.T) {
	rs := redistest.Start(t)
	clock := sluice.NewManualClock(needsStart)
	var srvs [2]*gateway.Server
	var admins [2]string
	for i := range srvs {
		srvs[i], admins[i] = fleetGateway(t, rs.Addr, clock)
	}
	// One counter per client on the Redis: alpha 8 on a (5 allowed), beta 7 on b (5 allowed).
	for i := 0; i < 8; i++ {
		decideAs(t, srvs[0], "alpha", "")
	}
	for i := 0; i < 7; i++ {
		decideAs(t, srvs[1], "beta", "")
	}
	clock.Advance(11 * time.Second)
	for _, srv := range srvs {
		gateway.FoldHistory(srv)
	}
	for i, want := range []string{"00:00:00 5/3/0 [{alpha 3}] x0", "00:00:00 5/2/0 [{beta 2}] x0"} {
		rep := readHistory(t, admins[i])
		if got := slotsText(rep.Instance); got != want {
			t.Errorf("gateway %d's own history: %s; want %s", i, got, want)
		}
		if got, want := slotsText(rep.Fleet), "00:00:00 10/5/0 [{alpha 3} {beta 2}] x2"; got != want || rep.FleetError != "" {
			t.Errorf("gateway %d's fleet history: %s (%s); want %s", i, got, rep.FleetError, want)
		}
	}
}

// TestFleetHistoryAfterOutage: a slot folded while the Redis is down is in this instance's
// history at once, and in the fleet's once the Redis is back — sent again at each fold until the
// store takes it, and counted once however often it is sent.
func TestFleetHistoryAfterOutage(t *testing.T) {
	rs := redistest.Start(t)
	clock := sluice.NewManualClock(needsStart)
	srv, admin := fleetGateway(t, rs.Addr, clock)
	for i := 0; i < 8; i++ {
		decideAs(t, srv, "alpha", "")
	}
	const own = "00:00:00 5/3/0 [{alpha 3}] x0"

	rs.Kill()
	clock.Advance(11 * time.Second)
	gateway.FoldHistory(srv)     // the store does not take the slot
	rep := readHistory(t, admin) // (its own fold: the store still down)
	if got := slotsText(rep.Instance); got != own {
		t.Fatalf("own history with the Redis down: %s; want %s", got, own)
	}
	if rep.FleetError == "" {
		t.Fatalf("fleet history with the Redis down: %s, no error", slotsText(rep.Fleet))
	}

	rs.Restart() // empty: the slot is in no key
	want := "00:00:00 5/3/0 [{alpha 3}] x1"
	deadline := time.Now().Add(30 * time.Second)
	for {
		gateway.FoldHistory(srv)
		rep = readHistory(t, admin)
		if rep.FleetError == "" && slotsText(rep.Fleet) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's history 30 s after the Redis came back: %s (%s); want %s", slotsText(rep.Fleet), rep.FleetError, want)
		}
	}
	for range 3 { // nothing left to send: folds and reads change nothing
		gateway.FoldHistory(srv)
	}
	if rep = readHistory(t, admin); slotsText(rep.Fleet) != want || slotsText(rep.Instance) != own {
		t.Errorf("after more folds: fleet %s, own %s; want the slot once", slotsText(rep.Fleet), slotsText(rep.Instance))
	}
}
