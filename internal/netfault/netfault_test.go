package netfault_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/netfault"
	"github.com/sluicehq/sluice/internal/redistest"
	"go.uber.org/goleak"
)

// dial connects to p with a deadline far beyond anything the test waits for on purpose, so that
// a hang fails the test instead of stalling it.
func dial(t *testing.T, p *netfault.Proxy) *redistest.Conn {
	t.Helper()
	c, err := redistest.Dial(p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ping sends PING on c and returns the round trip as the client sees it.
func ping(t *testing.T, c *redistest.Conn) time.Duration {
	t.Helper()
	t0 := time.Now()
	got, err := c.Do("PING")
	rtt := time.Since(t0)
	if err != nil || got != "PONG" {
		t.Fatalf("PING: %q, %v", got, err)
	}
	return rtt
}

// A PING through the proxy takes at least the two latencies, the proxy held each direction's
// chunk at least its latency (on its own clock), and it counted the exact bytes of the exchange.
func TestFixedLatencyDelaysEachDirection(t *testing.T) {
	srv := redistest.Start(t)
	p := netfault.Start(t, srv.Addr)
	up, down := 40*time.Millisecond, 25*time.Millisecond
	p.SetLatency(netfault.Fixed(up), netfault.Fixed(down))
	c := dial(t, p)
	for range 3 {
		before := p.Stats()
		rtt := ping(t, c)
		after := p.Stats()
		heldUp, heldDown := after.HeldUp-before.HeldUp, after.HeldDown-before.HeldDown
		if heldUp < up || heldDown < down {
			t.Errorf("held up %v (latency %v), down %v (latency %v)", heldUp, up, heldDown, down)
		}
		if rtt < heldUp+heldDown {
			t.Errorf("round trip %v < the %v + %v the proxy held the request and its answer", rtt, heldUp, heldDown)
		}
		if rtt < up+down {
			t.Errorf("round trip %v < the latency added, %v", rtt, up+down)
		}
		ping := int64(len(redistest.Command("PING")))
		if d := after.BytesUp - before.BytesUp; d != ping {
			t.Errorf("bytes up: %d, want %d (one PING)", d, ping)
		}
		if d := after.BytesDown - before.BytesDown; d != int64(len("+PONG\r\n")) {
			t.Errorf("bytes down: %d, want 7 (+PONG)", d)
		}
	}
	st := p.Stats()
	if st.Accepted != 1 || st.Active != 1 || st.ChunksUp != 3 || st.ChunksDown != 3 {
		t.Errorf("stats %+v: want 1 connection accepted and open, 3 chunks each way", st)
	}
	c.Close()
	waitFor(t, "the closed connection no longer active", 10*time.Second, func() bool { return p.Stats().Active == 0 })
}

// A uniform latency holds each chunk at least its minimum, and draws across its range.
func TestUniformLatency(t *testing.T) {
	srv := redistest.Start(t)
	p := netfault.Start(t, srv.Addr)
	lo, hi := 10*time.Millisecond, 40*time.Millisecond
	p.SetLatency(netfault.Uniform(lo, hi), netfault.Fixed(0))
	c := dial(t, p)
	mid := (lo + hi) / 2
	above := 0
	const n = 20
	for range n {
		before := p.Stats()
		rtt := ping(t, c)
		held := p.Stats().HeldUp - before.HeldUp
		if held < lo || rtt < held {
			t.Fatalf("held %v, round trip %v: want held ≥ %v and round trip ≥ held", held, rtt, lo)
		}
		if held >= mid {
			above++
		}
	}
	// Each draw is at or above the middle with probability 1/2 (more on a loaded machine): none
	// of 20 means the range is not drawn from (a 1-in-a-million chance otherwise).
	if above == 0 {
		t.Errorf("no chunk of %d held ≥ %v: the latency is not drawn from %v", n, mid, netfault.Uniform(lo, hi))
	}
}

// Random latencies never reorder the bytes of a connection: 200 pipelined ECHOs, each read by
// the proxy as its own chunk while those before it are still held, come back in order.
func TestRandomLatencyKeepsOrder(t *testing.T) {
	srv := redistest.Start(t)
	p := netfault.Start(t, srv.Addr)
	p.SetLatency(netfault.Uniform(0, 20*time.Millisecond), netfault.Uniform(0, 20*time.Millisecond))
	c := dial(t, p)
	const n = 200
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			if err := c.Send("ECHO", strconv.Itoa(i)); err != nil {
				errc <- err
				return
			}
			// the next command must be a chunk of its own
			for p.Stats().ReadUp < int64(i+1) {
				time.Sleep(50 * time.Microsecond)
			}
		}
		errc <- nil
	}()
	for i := range n {
		got, err := c.Reply()
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if got != strconv.Itoa(i) {
			t.Fatalf("reply %d is %q: bytes were reordered", i, got)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.ChunksUp != n || st.ReadUp != n || st.ChunksDown < 2 {
		t.Errorf("stats %+v: want each of the %d commands a chunk, and answers in more than one", st, n)
	}
}

// Cut resets open connections (a command on one fails at once) and new ones; Heal restores the
// link for new connections.
func TestCutAndHeal(t *testing.T) {
	srv := redistest.Start(t)
	p := netfault.Start(t, srv.Addr)
	c := dial(t, p)
	ping(t, c)
	p.Cut()
	if p.State() != netfault.Cut {
		t.Fatalf("state %v", p.State())
	}
	if got, err := c.Do("PING"); err == nil {
		t.Fatalf("PING on a cut connection answered %q", got)
	}
	// A new connection is accepted and reset: its command fails.
	if c2, err := redistest.Dial(p.Addr(), 5*time.Second); err == nil {
		_ = c2.SetDeadline(time.Now().Add(30 * time.Second))
		got, err := c2.Do("PING")
		c2.Close()
		if err == nil {
			t.Fatalf("PING on a connection opened while cut answered %q", got)
		}
		if isTimeout(err) {
			t.Fatalf("a cut should reset, not hang: %v", err)
		}
	}
	st := p.Stats()
	if st.Broken != 1 || st.Refused < 1 {
		t.Errorf("stats %+v: want 1 broken, at least 1 refused", st)
	}
	p.Heal()
	ping(t, dial(t, p))
}

// Blackhole freezes: a command waits (the client times out) and a new connection gets no
// answer; Heal delivers what waited, on the same connection, and new connections work.
func TestBlackholeFreezesAndHealDelivers(t *testing.T) {
	srv := redistest.Start(t)
	p := netfault.Start(t, srv.Addr)
	c := dial(t, p)
	ping(t, c)
	p.Blackhole()
	if err := c.Send("INCR", "frozen"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := c.Reply(); !isTimeout(err) {
		t.Fatalf("INCR through a blackhole: %q, %v; want a timeout", got, err)
	}
	if v, _ := srv.Do("GET", "frozen"); v != "" {
		t.Fatalf("the INCR reached the server through a blackhole: frozen=%q", v)
	}
	c2 := dial(t, p)
	if err := c2.Send("PING"); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := c2.Reply(); !isTimeout(err) {
		t.Fatalf("PING on a connection opened into a blackhole: %q, %v; want a timeout", got, err)
	}
	p.Heal()
	for _, cc := range []*redistest.Conn{c, c2} {
		_ = cc.SetReadDeadline(time.Now().Add(30 * time.Second))
	}
	if got, err := c.Reply(); err != nil || got != "1" {
		t.Fatalf("the INCR sent into the blackhole, after Heal: %q, %v; want 1", got, err)
	}
	if got, err := c2.Reply(); err != nil || got != "PONG" {
		t.Fatalf("the PING of the connection opened into the blackhole, after Heal: %q, %v", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Three regions' proxies in front of one Redis, used by go-redis clients concurrently while the
// latency changes: every INCR counts once; cutting one region fails its client's commands (with
// a timeout or an error) and leaves the others working; Heal gives it back.
func TestRegionsShareOneTarget(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const regions, workers, incrs = 3, 4, 25
	proxies := make([]*netfault.Proxy, regions)
	clients := make([]*redis.Client, regions)
	for i := range proxies {
		proxies[i] = netfault.Start(t, srv.Addr)
		proxies[i].SetLatency(netfault.Uniform(time.Millisecond, 5*time.Millisecond), netfault.Fixed(time.Millisecond))
		clients[i] = redis.NewClient(&redis.Options{Addr: proxies[i].Addr(), PoolSize: workers,
			DialTimeout: time.Second, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
			MaxRetries: -1})
		t.Cleanup(func() { clients[i].Close() })
	}
	var wg sync.WaitGroup
	errs := make(chan error, regions*workers)
	for r := range regions {
		for range workers {
			wg.Go(func() {
				for range incrs {
					if err := clients[r].Incr(ctx, "n").Err(); err != nil {
						errs <- fmt.Errorf("region %d: %w", r, err)
						return
					}
				}
			})
		}
		wg.Go(func() { // change the latency while the clients run
			for i := range 10 {
				proxies[r].SetLatency(netfault.Fixed(time.Duration(i%3)*time.Millisecond), netfault.Fixed(time.Millisecond))
				proxies[r].Stats()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, err := srv.Do("GET", "n"); err != nil || got != strconv.Itoa(regions*workers*incrs) {
		t.Fatalf("n = %q, %v; want %d", got, err, regions*workers*incrs)
	}
	for i, p := range proxies {
		st := p.Stats()
		if st.Accepted < 1 || st.Accepted > workers || st.BytesUp == 0 || st.BytesDown == 0 {
			t.Errorf("region %d: stats %+v", i, st)
		}
	}

	proxies[0].Cut()
	if err := clients[0].Ping(ctx).Err(); err == nil {
		t.Error("the cut region's PING answered")
	}
	for i := 1; i < regions; i++ {
		if err := clients[i].Ping(ctx).Err(); err != nil {
			t.Errorf("region %d, not cut: %v", i, err)
		}
	}
	proxies[1].Blackhole()
	if err := clients[1].Ping(ctx).Err(); !isTimeout(err) {
		t.Errorf("the blackholed region's PING: %v, want a timeout", err)
	}
	if err := clients[2].Ping(ctx).Err(); err != nil {
		t.Errorf("region 2, not cut: %v", err)
	}
	proxies[0].Heal()
	proxies[1].Heal()
	for i := range regions {
		if err := clients[i].Ping(ctx).Err(); err != nil {
			t.Errorf("region %d after Heal: %v", i, err)
		}
	}
}

// Close ends open and blackholed connections and returns once the proxy's goroutines are done.
func TestCloseEndsConnections(t *testing.T) {
	srv := redistest.Start(t)
	before := goleak.IgnoreCurrent()
	p, err := netfault.Listen(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	ping(t, c)
	p.Blackhole()
	c2 := dial(t, p)
	waitFor(t, "two connections active", 10*time.Second, func() bool { return p.Stats().Active == 2 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Active != 0 {
		t.Errorf("after Close: %+v", st)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left after Close: %v", err)
	}
	for _, cc := range []*redistest.Conn{c, c2} {
		if _, err := cc.Do("PING"); err == nil {
			t.Error("a connection answered after Close")
		}
	}
	if _, err := redistest.Dial(p.Addr(), time.Second); err == nil {
		t.Error("the closed proxy accepted a connection")
	}
}
