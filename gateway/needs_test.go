package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/identity"
)

// needsConfig: steady sends 10 a minute under a limit of 1000 a minute; busy sends 95 a minute
// under 100, with a burst of 130 every tenth minute; spiky sends 10 a minute under 100, with one
// runaway minute of 300.
const needsConfig = `
listen: ""
policies:
  - {name: roomy, algorithm: fixed-window, limit: 1000, period: 1m}
  - {name: tight, algorithm: fixed-window, limit: 100, period: 1m}
  - {name: spare, algorithm: fixed-window, limit: 100, period: 1m}
  - {name: open, algorithm: token-bucket, limit: 100, period: 1s}
default_policy: open
clients:
  - {name: steady, api_key_sha256: ` + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + `, policy: roomy}
  - {name: busy, api_key_sha256: ` + "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" + `, policy: tight}
  - {name: spiky, api_key_sha256: ` + "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc" + `, policy: spare}
`

// needsStart is the virtual clock's start: a Monday's midnight, UTC.
var needsStart = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// clockedServer runs needsConfig on a memory store and a virtual clock at needsStart, its admin
// listener on a real loopback server (with mount, if not nil, beside it).
func clockedServer(t *testing.T, mount http.Handler) (*gateway.Server, *sluice.ManualClock, string) {
	t.Helper()
	cfg, err := config.Parse([]byte(needsConfig), "needs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(needsStart)
	srv, err := gateway.NewClockedServer(cfg, clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if mount != nil {
		srv.Mount("GET /", mount)
	}
	hs := httptest.NewServer(srv.Admin())
	t.Cleanup(hs.Close)
	return srv, clock, hs.URL
}

// decideAs decides one request of the configured client name (or, if it is not configured, of
// an anonymous client with key) at the clock's time, through the Server: its observer records it.
func decideAs(t testing.TB, srv *gateway.Server, name, key string) bool {
	cfg := srv.Config()
	c, ok := cfg.ClientByName(name)
	who := identity.Identity{Key: key}
	if ok {
		who = identity.Identity{Client: name, Key: name}
	} else {
		c = nil
	}
	req, _ := gateway.PoliciesOf(srv).Named(who, c, "")
	v := srv.Decide(context.Background(), &req)
	defer v.Release()
	return v.Passes()
}

// feedDay sends minutes minutes of the three clients' traffic from needsStart, in time order on
// the virtual clock, and returns what busy and spiky had refused.
func feedDay(t testing.TB, srv *gateway.Server, clock *sluice.ManualClock, minutes int) (busyRefused, spikyRefused int) {
	type arrival struct {
		at     time.Duration // into the minute
		client string
	}
	for m := 0; m < minutes; m++ {
		var plan []arrival
		for i := 0; i < 10; i++ {
			plan = append(plan, arrival{time.Duration(i) * 6 * time.Second, "steady"})
		}
		n := 95
		if m%10 == 9 {
			n = 130 // a burst: 30 over the limit
		}
		for i := 0; i < n; i++ {
			plan = append(plan, arrival{time.Duration(i) * time.Minute / time.Duration(n), "busy"})
		}
		s := 10
		if m == minutes/2 {
			s = 300 // a runaway minute
		}
		for i := 0; i < s; i++ {
			plan = append(plan, arrival{time.Duration(i) * time.Minute / time.Duration(s), "spiky"})
		}
		// In time order (the clock only moves forward).
		for i := 1; i < len(plan); i++ {
			for j := i; j > 0 && plan[j].at < plan[j-1].at; j-- {
				plan[j], plan[j-1] = plan[j-1], plan[j]
			}
		}
		base := needsStart.Add(time.Duration(m) * time.Minute)
		for _, a := range plan {
			clock.Set(base.Add(a.at))
			if !decideAs(t, srv, a.client, "") {
				switch a.client {
				case "busy":
					busyRefused++
				case "spiky":
					spikyRefused++
				case "steady":
					t.Fatalf("steady refused at %v", clock.Now())
				}
			}
		}
	}
	return busyRefused, spikyRefused
}

func getJSON(t *testing.T, url string, into any) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var p struct {
			Detail string `json:"detail"`
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("GET %s: %d with Content-Type %q, want a problem", url, resp.StatusCode, ct)
		}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, p.Detail
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatal(err)
	}
	return 200, ""
}

func needsPolicy(t *testing.T, r gateway.NeedsReport, name string) gateway.PolicyNeeds {
	t.Helper()
	for _, p := range r.Policies {
		if p.Policy == name {
			return p
		}
	}
	t.Fatalf("%s: no policy %q in %+v", r.Client, name, r.Policies)
	return gateway.PolicyNeeds{}
}

func kinds(fs []gateway.NeedsFlag) string {
	var k []string
	for _, f := range fs {
		k = append(k, f.Kind)
	}
	return strings.Join(k, ",")
}

// A recorded day: each client's use per window beside its limit, its flags, and the what-if,
// whose replay of the current limit refuses exactly what the gateway refused, and of a higher
// one fewer.
func TestNeedsRecordedDay(t *testing.T) {
	t.Parallel()
	srv, clock, admin := clockedServer(t, nil)
	const minutes = 24 * 60
	busyRefused, spikyRefused := feedDay(t, srv, clock, minutes)
	if busyRefused != 144*30 || spikyRefused != 200 {
		t.Fatalf("the gateway refused busy %d, spiky %d; want 4320 and 200", busyRefused, spikyRefused)
	}
	need := func(client string) gateway.PolicyNeeds {
		var r gateway.NeedsReport
		if code, detail := getJSON(t, admin+"/v1/clients/"+client+"/needs", &r); code != 200 {
			t.Fatalf("%s: %d %s", client, code, detail)
		}
		if r.Client != client || r.KeptDays != 7 || len(r.Policies) != 1 {
			t.Fatalf("%s's report: %+v", client, r)
		}
		return r.Policies[0]
	}

	steady := need("steady")
	if steady.Policy != "roomy" || steady.Limit != 1000 || steady.Window != "1m" || steady.Peak != 10 || steady.P99 != 10 ||
		steady.Windows != minutes-1 || steady.Current != 10 || steady.Refused != 0 || steady.Offered != 10*minutes {
		t.Fatalf("steady: %+v", steady)
	}
	if kinds(steady.Flags) != "far_above" || steady.Flags[0].Detail != "limit 1000/min, p99 use 10/min (peak 10/min) over 1439 windows" {
		t.Fatalf("steady's flags: %+v, want far_above", steady.Flags)
	}

	busy := need("busy")
	if busy.Peak != 100 || busy.P50 != 95 || busy.P99 != 100 || busy.Refused != int64(busyRefused) {
		t.Fatalf("busy: %+v", busy)
	}
	if kinds(busy.Flags) != "too_low" || !strings.Contains(busy.Flags[0].Detail, "4320 requests refused") {
		t.Fatalf("busy's flags: %+v, want too_low", busy.Flags)
	}
	// A runaway minute refused is no sign of a low limit: spiky's median window is 10 of 100.
	spiky := need("spiky")
	if spiky.Refused != 200 || spiky.P50 != 10 || spiky.Peak != 100 || len(spiky.Flags) != 0 {
		t.Fatalf("spiky: %+v, want 200 refused and no flag", spiky)
	}
	// The timeline's summary: the last 24 hours, busy's offered and refused in each.
	if len(busy.Hours) != 24 || busy.Hours[23].Offered != 6*95*10+6*35 || busy.Hours[23].Refused != 6*30 {
		t.Fatalf("busy's last hour: %+v", busy.Hours[len(busy.Hours)-1])
	}

	whatIf := func(client, query string) gateway.WhatIf {
		var w gateway.WhatIf
		if code, detail := getJSON(t, admin+"/v1/clients/"+client+"/needs?"+query, &w); code != 200 {
			t.Fatalf("%s?%s: %d %s", client, query, code, detail)
		}
		return w
	}
	same := whatIf("busy", "policy=tight&limit=100")
	if same.Offered != busy.Offered || same.RefusedAsRecorded != int64(busyRefused) || same.WouldRefuse != int64(busyRefused) {
		t.Fatalf("what-if at the current limit: %+v, want %d offered and %d refused, as recorded", same, busy.Offered, busyRefused)
	}
	if higher := whatIf("busy", "policy=tight&limit=120"); higher.WouldRefuse != 144*10 || higher.Proposed.Limit != 120 || higher.Current.Limit != 100 {
		t.Fatalf("what-if at 120: %+v, want 1440 refused", higher)
	}
	if enough := whatIf("busy", "policy=tight&limit=130"); enough.WouldRefuse != 0 {
		t.Fatalf("what-if at 130: %+v, want none refused", enough)
	}
	// A period and an algorithm of its own: 200 per 2 minutes holds every burst.
	if w := whatIf("busy", "policy=tight&limit=200&period=2m&algorithm=sliding-window"); w.WouldRefuse >= int64(busyRefused) || w.Proposed.Window != "2m" {
		t.Fatalf("what-if of 200 per 2m, sliding: %+v", w)
	}
	if w := whatIf("steady", "policy=roomy&limit=5"); w.WouldRefuse != 5*minutes {
		t.Fatalf("steady at 5/min: %+v, want %d refused", w, 5*minutes)
	}
}

// Bad input is answered with a problem naming the field, and a client or policy that is not
// there with 404.
func TestNeedsBadInput(t *testing.T) {
	t.Parallel()
	srv, clock, admin := clockedServer(t, nil)
	feedDay(t, srv, clock, 2)
	for _, c := range []struct {
		path, query string
		status      int
		field       string
	}{
		{"nobody", "", 404, "client"},
		{"busy", "policy=roomy", 404, "policy"},
		{"busy", "policy=nope&limit=5", 404, "policy"},
		{"busy", "limit=5", 400, "policy"},
		{"busy", "policy=tight&limit=abc", 400, "limit"},
		{"busy", "policy=tight&limit=0", 400, "limit"},
		{"busy", "policy=tight&limit=-3", 400, "limit"},
		{"busy", "policy=tight&limit=99999999999999999999", 400, "limit"},
		{"busy", "policy=tight&period=soon", 400, "period"},
		{"busy", "policy=tight&period=1ns", 400, "period"},
		{"busy", "policy=tight&algorithm=fastest", 400, "algorithm"},
		{"busy", "policy=tight&algorithm=concurrency", 400, "algorithm"},
		{"busy", "policy=tight&limits=5", 400, `query parameter "limits"`},
		{"anonymous", "policy=open&limit=5", 404, "policy"}, // no anonymous request yet
	} {
		url := admin + "/v1/clients/" + c.path + "/needs?" + c.query
		code, detail := getJSON(t, url, nil)
		if code != c.status || !strings.HasPrefix(detail, c.field+": ") {
			t.Errorf("%s: %d %q, want %d naming %s", url, code, detail, c.status, c.field)
		}
	}
	// A configured client not seen yet: its policies, with no use.
	var r gateway.NeedsReport
	_, _, admin2 := clockedServer(t, nil)
	if code, _ := getJSON(t, admin2+"/v1/clients/busy/needs", &r); code != 200 || len(r.Policies) != 1 || r.Policies[0].Recorded || r.Policies[0].Limit != 100 {
		t.Fatalf("an unseen configured client: %d %+v", code, r)
	}
}

// Anonymous clients aggregate into one record, whatever their number; clients beyond the bound
// take the place of the least recently active; many goroutines record at once.
func TestNeedsBounded(t *testing.T) {
	t.Parallel()
	srv, clock, admin := clockedServer(t, nil)
	var wg sync.WaitGroup
	const workers, each = 16, 100_000 / 16
	// A reader asks for the report all the while (it reads what the writers change).
	done, read := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		for {
			resp, err := http.Get(admin + "/v1/clients/anonymous/needs")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("the report while recording: %d", resp.StatusCode)
				return
			}
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				decideAs(t, srv, "", fmt.Sprintf("ip:10.%d.%d.%d", w, i/256, i%256))
			}
		}()
	}
	wg.Wait()
	close(done)
	<-read
	clients, series, pages := gateway.NeedsKept(srv)
	if clients != 1 || series != 1 || pages != 1 {
		t.Fatalf("after %d anonymous addresses: %d clients, %d series, %d pages kept; want 1 each", workers*each, clients, series, pages)
	}
	var r gateway.NeedsReport
	getJSON(t, admin+"/v1/clients/anonymous/needs", &r)
	// A token bucket's use is counted per period: all of it in the one second they came in.
	if p := needsPolicy(t, r, "open"); !p.Aggregate || p.Offered != workers*each || p.Window != "1s" || p.Current != workers*each || len(p.Flags) != 0 {
		t.Fatalf("anonymous: %+v, want every request in one aggregate series, its second's use, no flags", p)
	}
	if code, detail := getJSON(t, admin+"/v1/clients/anonymous/needs?policy=open&limit=5", nil); code != 400 || !strings.HasPrefix(detail, "policy: ") {
		t.Fatalf("a what-if of the anonymous aggregate: %d %q", code, detail)
	}

	// Clients made at runtime (not configured), more than the bound, one a second.
	extra := gateway.MaxNeedsClients + 50
	for i := 0; i < extra; i++ {
		clock.Advance(time.Second)
		req, _ := gateway.PoliciesOf(srv).Named(identity.Identity{Key: "ip:1"}, nil, "")
		req.Client = fmt.Sprintf("runtime-%03d", i)
		v := srv.Decide(context.Background(), &req)
		v.Release()
	}
	if clients, _, _ := gateway.NeedsKept(srv); clients != gateway.MaxNeedsClients {
		t.Fatalf("%d clients kept, want the bound, %d", clients, gateway.MaxNeedsClients)
	}
	// The first ones (and anonymous, quiet since) are gone; the latest are kept.
	if code, _ := getJSON(t, admin+"/v1/clients/runtime-000/needs", nil); code != 404 {
		t.Fatalf("the least recently active client: %d, want 404 (evicted)", code)
	}
	if code, _ := getJSON(t, admin+fmt.Sprintf("/v1/clients/runtime-%03d/needs", extra-1), &r); code != 200 || len(r.Policies) != 1 || r.Policies[0].Offered != 1 {
		t.Fatalf("the latest client: %d %+v", code, r)
	}
}

// A client keeps at most four policies: a fifth (a reload renamed them) takes the place of the
// least recently used one.
func TestNeedsPolicySlots(t *testing.T) {
	t.Parallel()
	srv, clock, admin := clockedServer(t, nil)
	c, _ := srv.Config().ClientByName("busy")
	req, _ := gateway.PoliciesOf(srv).Named(identity.Identity{Client: "busy", Key: "busy"}, c, "")
	v := srv.Decide(context.Background(), &req)
	defer v.Release()
	for i := 0; i < 6; i++ {
		clock.Advance(time.Second)
		renamed := req
		renamed.Limits = slices.Clone(req.Limits) // (shared by every request: not modified)
		renamed.Limits[0].PolicyName = fmt.Sprintf("tight-%d", i)
		gateway.RecordNeeds(srv, &renamed, &v, clock.Now())
	}
	var r gateway.NeedsReport
	getJSON(t, admin+"/v1/clients/busy/needs", &r)
	var names []string
	for _, p := range r.Policies {
		if p.Recorded {
			names = append(names, p.Policy)
		}
	}
	// tight (the first decision), tight-0 and tight-1 made room for tight-3, tight-4 and tight-5.
	if got := strings.Join(names, ","); got != "tight-2,tight-3,tight-4,tight-5" {
		t.Fatalf("kept policies: %s", got)
	}
}

// Recording a request allocates nothing once its minute is kept; the minute page is the size the
// documentation's bound says.
func TestNeedsRecordAllocates(t *testing.T) {
	srv, clock, _ := clockedServer(t, nil)
	c, _ := srv.Config().ClientByName("busy")
	req, _ := gateway.PoliciesOf(srv).Named(identity.Identity{Client: "busy", Key: "busy"}, c, "")
	v := srv.Decide(context.Background(), &req)
	defer v.Release()
	now := clock.Now()
	if n := testing.AllocsPerRun(1000, func() { gateway.RecordNeeds(srv, &req, &v, now) }); n != 0 {
		t.Fatalf("recording a request allocates %v times, want 0", n)
	}
	if doc, real := gateway.NeedPageBytes(); doc != real {
		t.Fatalf("a minute page is %d bytes; the bound says %d", real, doc)
	}
}
