package xds

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/internal/xdstest"
	"github.com/sluicehq/sluice/rls/envoyconf"
)

func domain(name string, rpu uint32) *rlsconfpb.RateLimitConfig {
	return &rlsconfpb.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconfpb.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_MINUTE, RequestsPerUnit: rpu}}}}
}

// rpu is the limit of domain d's descriptor k in c, 0 if c has no such domain.
func rpu(c *envoyconf.Config, d string) uint32 {
	m, ok := c.Match(d, []envoyconf.Entry{{Key: "k", Value: "v"}}, nil)
	if !ok {
		return 0
	}
	return m.RequestsPerUnit
}

// next waits for the next configuration applied.
func next(t *testing.T, got <-chan *envoyconf.Config) *envoyconf.Config {
	t.Helper()
	select {
	case c := <-got:
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("no update applied within 30s")
		return nil
	}
}

// Over mutual TLS, the client applies each update whole and ACKs it, NACKs an invalid one with
// a message naming the resource and the field (applying nothing), and after the server dies and
// comes back it subscribes again and applies what the server has then.
func TestSubscription(t *testing.T) {
	xs := xdstest.Start(t, true)
	reg := prometheus.NewRegistry()
	tlsc, err := TLSConfig(xs.CA, xs.Cert, xs.Key, xs.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *envoyconf.Config, 10)
	c, err := Start(Options{Server: xs.Addr, NodeID: xs.NodeID, TLS: tlsc, RetryInitial: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Log: slog.New(slog.DiscardHandler), Registerer: reg}, func(c *envoyconf.Config) { got <- c })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	select {
	case <-c.Loaded():
		t.Fatal("loaded before any update")
	default:
	}

	v := xs.Set(t, domain("a", 5), domain("b", 7))
	conf := next(t, got)
	if d := conf.Domains(); !slices.Equal(d, []string{"a", "b"}) || rpu(conf, "a") != 5 || rpu(conf, "b") != 7 {
		t.Fatalf("first update: domains %v, limits %d %d", d, rpu(conf, "a"), rpu(conf, "b"))
	}
	xs.WaitAcked(t, v, 1)
	<-c.Loaded()
	if g := testutil.ToFloat64(c.connected); g != 1 {
		t.Errorf("sluice_rls_xds_connected %v, want 1", g)
	}

	v = xs.Set(t, domain("a", 9)) // a changed, b removed
	conf = next(t, got)
	if d := conf.Domains(); !slices.Equal(d, []string{"a"}) || rpu(conf, "a") != 9 {
		t.Fatalf("second update: domains %v, limit %d", d, rpu(conf, "a"))
	}
	xs.WaitAcked(t, v, 1)

	bad := domain("c", 1)
	bad.Descriptors[0].RateLimit.Unit = rlsconfpb.RateLimitUnit_UNKNOWN
	v = xs.Set(t, domain("a", 3), bad)
	msgs := xs.WaitNacked(t, v, 1)
	if want := `xds:c: descriptors[0] "k": rate_limit.unit is required`; !strings.Contains(msgs[0], want) {
		t.Errorf("NACK %q, want it to say %q", msgs[0], want)
	}
	select {
	case c := <-got:
		t.Fatalf("an invalid update was applied: %v", c.Domains())
	default:
	}
	if a, r := testutil.ToFloat64(c.applied), testutil.ToFloat64(c.rejected); a != 2 || r != 1 {
		t.Errorf("updates applied %v rejected %v, want 2 and 1", a, r)
	}

	xs.Stop()
	waitGauge(t, c.connected, 0)
	xs.Restart(t)
	v = xs.Set(t, domain("b", 4))
	for conf = next(t, got); rpu(conf, "b") != 4; conf = next(t, got) {
		// the restarted server may first send the version it kept, if the stream opened before Set
	}
	xs.WaitAcked(t, v, 1)
	waitGauge(t, c.connected, 1)
	n, err := testutil.GatherAndCount(reg, "sluice_rls_xds_updates_total", "sluice_rls_xds_connected")
	if err != nil || n != 3 {
		t.Errorf("registered series %d (%v), want 3", n, err)
	}
}

// A client without a certificate is refused by a server that requires one: nothing is applied,
// and the client keeps trying (the stream never opens).
func TestSubscriptionNeedsClientCert(t *testing.T) {
	xs := xdstest.Start(t, true)
	xs.Set(t, domain("a", 5))
	tlsc, err := TLSConfig(xs.CA, "", "", xs.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *envoyconf.Config, 1)
	c, err := Start(Options{Server: xs.Addr, NodeID: xs.NodeID, TLS: tlsc, RetryInitial: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Log: slog.New(slog.DiscardHandler)}, func(c *envoyconf.Config) { got <- c })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	// A second client, with its certificate, subscribed after the first: once it has applied the
	// update, the first has had every chance to.
	tlsc2, err := TLSConfig(xs.CA, xs.Cert, xs.Key, xs.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Start(Options{Server: xs.Addr, NodeID: xs.NodeID, TLS: tlsc2, Log: slog.New(slog.DiscardHandler)}, func(*envoyconf.Config) {})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Stop()
	<-c2.Loaded()
	select {
	case <-got:
		t.Fatal("a client without a certificate was sent the rules")
	default:
	}
}

func TestOptionsErrors(t *testing.T) {
	if _, err := Start(Options{NodeID: "n"}, nil); err == nil || !strings.Contains(err.Error(), "server") {
		t.Errorf("no server: %v", err)
	}
	if _, err := Start(Options{Server: "127.0.0.1:1"}, nil); err == nil || !strings.Contains(err.Error(), "node id") {
		t.Errorf("no node id: %v", err)
	}
	if _, err := TLSConfig("", "cert.pem", "", ""); err == nil || !strings.Contains(err.Error(), "tls.key_file") {
		t.Errorf("cert without key: %v", err)
	}
	if _, err := TLSConfig("/nonexistent/ca.pem", "", "", ""); err == nil || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Errorf("missing CA: %v", err)
	}
}

// waitGauge polls g until it is want (30 s at most).
func waitGauge(t *testing.T, g prometheus.Gauge, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(g) != want {
		if time.Now().After(deadline) {
			t.Fatalf("gauge %v, want %v", testutil.ToFloat64(g), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
