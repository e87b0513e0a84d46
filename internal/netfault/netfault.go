// Package netfault is a TCP proxy for tests that puts a slow or broken network between a client
// and a server on loopback: it listens on a free loopback port and forwards every connection to a
// target address, holding each chunk of bytes for a latency of its direction (fixed, or uniformly
// random in a range) without reordering the bytes of a connection, and it can cut the link and
// heal it again. It counts connections, bytes, and the time it held them.
//
// # How the regions benchmark uses it
//
// The cross-region limit of issue 34 is measured with three regions on one machine: each region
// has its own redis-server (redistest.Start) and two `sluice serve` processes, and each region
// reaches the one global Redis (the ledger) only through its own Proxy:
//
//	ledger := redistest.Start(t)
//	for _, name := range []string{"eu", "us", "ap"} {
//		p := netfault.Start(t, ledger.Addr)
//		p.SetLatency(netfault.Uniform(50*time.Millisecond, 150*time.Millisecond), // region → ledger
//			netfault.Uniform(50*time.Millisecond, 150*time.Millisecond)) // ledger → region
//		// the region's sluice serve processes get region.global.addrs: [p.Addr()]
//	}
//
// A partition of one region is p.Blackhole() (packets lost: its requests to the ledger hang until
// they time out, and are delivered if it heals first) or p.Cut() (the ledger's host is gone: its
// connections are reset and new ones refused), ended by p.Heal(); the other regions' proxies are
// untouched. Stats tells how much each region talked to the ledger and how long its bytes were
// held, so that a test can tell the latency it added from the time sluice itself adds.
//
// The same traffic is then sent to Gubernator (peertest.StartGubernators: three instances as one
// cluster on loopback, GLOBAL behaviour, one instance per region), and the worldwide admissions
// over the limit and the added latency of both are reported side by side. Gubernator's instances
// talk to each other directly, so its inter-region latency is not added by this package: the
// benchmark says so beside its figures.
package netfault

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Latency is the time a chunk is held in one direction: uniformly random in [Min, Max] (a fixed
// latency has Min == Max; the zero Latency holds nothing).
type Latency struct{ Min, Max time.Duration }

// Fixed is a latency of exactly d.
func Fixed(d time.Duration) Latency { return Latency{d, d} }

// Uniform is a latency drawn uniformly from [lo, hi] for each chunk.
func Uniform(lo, hi time.Duration) Latency { return Latency{lo, hi} }

// sample draws one delay with r.
func (l Latency) sample(r *rand.Rand) time.Duration {
	if l.Max <= l.Min {
		return l.Min
	}
	return l.Min + time.Duration(r.Int64N(int64(l.Max-l.Min)+1))
}

func (l Latency) String() string {
	if l.Min == l.Max {
		return l.Min.String()
	}
	return l.Min.String() + "–" + l.Max.String()
}

// State is the link's condition.
type State int

const (
	// Up forwards everything (after the latency).
	Up State = iota
	// Blackholed: new connections are accepted but not connected through, and existing ones
	// forward nothing, as when packets are lost; what was sent waits and is delivered on Heal
	// (as TCP retransmits it), unless the connection was closed meanwhile.
	Blackholed
	// Cut: new connections are reset as soon as they are accepted and existing ones were reset
	// when the link was cut, as when the far host is gone.
	Cut
)

func (s State) String() string {
	switch s {
	case Up:
		return "up"
	case Blackholed:
		return "blackholed"
	case Cut:
		return "cut"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Stats are a proxy's counters since it started. Up is client → target, Down target → client.
type Stats struct {
	Accepted int64 // connections accepted (including those then reset by a cut)
	Refused  int64 // connections reset at once because the link was cut
	Broken   int64 // connections reset by Cut while open
	Active   int64 // connections open now
	Dials    int64 // connections to the target that failed to open
	// Bytes and chunks forwarded, and the time the forwarded chunks were held in all (from the
	// proxy reading a chunk to its writing it, on the proxy's monotonic clock): a client's round
	// trip through the proxy takes at least the Held of its request plus that of its answer. A
	// chunk is counted just before it is written, so a client that has an answer sees it here.
	BytesUp, BytesDown   int64
	ChunksUp, ChunksDown int64
	HeldUp, HeldDown     time.Duration
	// Chunks read from either side, forwarded or not yet: Read − Chunks are held now.
	ReadUp, ReadDown int64
}

// Proxy is one link from its listening address to a target.
type Proxy struct {
	target string
	ln     net.Listener

	mu       sync.Mutex
	up, down Latency
	state    State
	healed   chan struct{} // closed when the link leaves Blackholed
	conns    map[*link]struct{}
	closed   bool
	rng      *rand.Rand // guarded by mu

	accepted, refused, broken, active, dials atomic.Int64
	bytesUp, bytesDown, chunksUp, chunksDown atomic.Int64
	heldUp, heldDown                         atomic.Int64 // nanoseconds
	readUp, readDown                         atomic.Int64
	wg                                       sync.WaitGroup
}

// Listen starts a proxy on a free loopback port that forwards to target (host:port).
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[*link]struct{}{}, healed: make(chan struct{}),
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	close(p.healed)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Start is Listen for a test: it fails tb if the proxy cannot listen and closes it when tb ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Listen(target)
	if err != nil {
		tb.Fatalf("netfault: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr is the proxy's address (127.0.0.1:port), for clients to connect to instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// SetLatency sets the latency of each direction: up for bytes from the client to the target,
// down for the answers. It applies to chunks read from then on, on open connections too; a chunk
// is never delivered before one read earlier on the same connection and direction, so a shorter
// latency drawn after a longer one waits for it.
func (p *Proxy) SetLatency(up, down Latency) {
	p.mu.Lock()
	p.up, p.down = up, down
	p.mu.Unlock()
}

// Latency returns the latencies SetLatency set.
func (p *Proxy) Latency() (up, down Latency) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up, p.down
}

// State returns the link's condition.
func (p *Proxy) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Cut breaks the link: every open connection is reset (both its ends), and new ones are reset as
// soon as they are accepted, until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.setState(Cut)
	conns := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		conns = append(conns, l)
	}
	p.mu.Unlock()
	for _, l := range conns {
		if l.reset() {
			p.broken.Add(1)
		}
	}
}

// Blackhole freezes the link: nothing is forwarded in either direction and new connections are
// accepted but not connected through to the target, until Heal, which delivers what waited.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.setState(Blackholed)
	p.mu.Unlock()
}

// Heal brings the link up again: frozen connections go on, with the bytes that waited delivered
// in order, and new connections are forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.setState(Up)
	p.mu.Unlock()
}

// setState changes the state; p.mu is held.
func (p *Proxy) setState(s State) {
	if p.state == Blackholed && s != Blackholed {
		close(p.healed)
	}
	if p.state != Blackholed && s == Blackholed {
		p.healed = make(chan struct{})
	}
	p.state = s
}

// gate returns the state and, while Blackholed, a channel closed when it no longer is.
func (p *Proxy) gate() (State, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, p.healed
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.accepted.Load(), Refused: p.refused.Load(), Broken: p.broken.Load(),
		Active: p.active.Load(), Dials: p.dials.Load(),
		BytesUp: p.bytesUp.Load(), BytesDown: p.bytesDown.Load(),
		ChunksUp: p.chunksUp.Load(), ChunksDown: p.chunksDown.Load(),
		HeldUp: time.Duration(p.heldUp.Load()), HeldDown: time.Duration(p.heldDown.Load()),
		ReadUp: p.readUp.Load(), ReadDown: p.readDown.Load(),
	}
}

// Close stops listening, closes every connection and waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.state == Blackholed {
		p.setState(Up) // release waiting goroutines; their links are closed below
	}
	conns := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		conns = append(conns, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range conns {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		p.accepted.Add(1)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		if p.state == Cut {
			p.mu.Unlock()
			p.refused.Add(1)
			resetConn(c)
			continue
		}
		l := &link{p: p, client: c, done: make(chan struct{})}
		p.conns[l] = struct{}{}
		p.active.Add(1)
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// resetConn closes c with an RST rather than a FIN, so that its peer sees a reset.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// link is one client connection and its connection to the target.
type link struct {
	p      *Proxy
	client net.Conn

	mu       sync.Mutex
	server   net.Conn // nil until dialled
	done     chan struct{}
	finished bool
}

// run connects the client through to the target (after any blackhole is healed) and forwards
// both directions until both are done or the link is closed.
func (l *link) run() {
	p := l.p
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
		p.active.Add(-1)
	}()
	if !l.waitUp() {
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		p.dials.Add(1)
		resetConn(l.client)
		return
	}
	l.mu.Lock()
	if l.finished {
		l.mu.Unlock()
		s.Close()
		return
	}
	l.server = s
	l.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pipe(l.client, s, true) }()
	go func() { defer wg.Done(); l.pipe(s, l.client, false) }()
	wg.Wait()
}

// waitUp waits while the link is Blackholed; false if the link was closed or cut meanwhile.
func (l *link) waitUp() bool {
	for {
		st, healed := l.p.gate()
		switch st {
		case Up:
			return true
		case Cut:
			return false
		}
		select {
		case <-healed:
		case <-l.done:
			return false
		}
	}
}

type chunk struct {
	data []byte
	read time.Time // when the proxy read it
	due  time.Time // not to be written before
}

// pipe forwards src to dst: a reader stamps each chunk with the time it is due (read time plus
// a latency drawn for it) and queues it, and one writer delivers the queue in order, each chunk
// once due and the link not blackholed, so a chunk whose draw was shorter than the one before it
// waits for that one. When src ends, dst's write side is closed after the last chunk.
func (l *link) pipe(src, dst net.Conn, up bool) {
	p := l.p
	queue := make(chan chunk, 64)
	var reader sync.WaitGroup
	// Every way out of the writer below either drains the queue (the reader is done) or closes
	// the link (which ends the reader's Read), so the wait is short; it keeps Close's promise that
	// no goroutine of the proxy outlives it.
	defer reader.Wait()
	reader.Go(func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				now := time.Now()
				p.mu.Lock()
				lat := p.down
				if up {
					lat = p.up
				}
				d := lat.sample(p.rng)
				p.mu.Unlock()
				due := now.Add(d)
				if up {
					p.readUp.Add(1)
				} else {
					p.readDown.Add(1)
				}
				select {
				case queue <- chunk{buf[:n], now, due}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if !l.waitUp() {
			l.close() // cut or closed: the other direction must not wait for this one
			return
		}
		// Counted before the write, so that a peer that has the bytes sees them counted; a
		// write that fails takes back what it did not write.
		bytes, chunks, heldNs := &p.bytesDown, &p.chunksDown, &p.heldDown
		if up {
			bytes, chunks, heldNs = &p.bytesUp, &p.chunksUp, &p.heldUp
		}
		bytes.Add(int64(len(c.data)))
		chunks.Add(1)
		heldNs.Add(int64(time.Since(c.read)))
		if n, err := dst.Write(c.data); err != nil {
			bytes.Add(int64(n - len(c.data)))
			l.close()
			return
		}
	}
	select {
	case <-l.done:
		return
	default:
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	if !up {
		// The target closed its side and all of it was delivered: the client's connection is
		// over even if the client keeps its write side open.
		l.close()
	}
}

// close ends the link (both connections); it reports whether this call ended it.
func (l *link) close() bool { return l.end(false) }

// reset ends the link with a reset on both connections.
func (l *link) reset() bool { return l.end(true) }

func (l *link) end(rst bool) bool {
	l.mu.Lock()
	if l.finished {
		l.mu.Unlock()
		return false
	}
	l.finished = true
	s := l.server
	close(l.done)
	l.mu.Unlock()
	for _, c := range []net.Conn{l.client, s} {
		if c == nil {
			continue
		}
		if rst {
			resetConn(c)
		} else {
			_ = c.Close()
		}
	}
	return true
}
