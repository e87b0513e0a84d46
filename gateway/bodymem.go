package gateway

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BODY MEMORY. A usage route's request body is read whole before it is decided (usage.go): its
// estimate needs all of it. A body is held once — the bytes read are the bytes parsed in place
// and forwarded — and only until the upstream has it. What all of them hold at once is bounded
// by server.body_memory: a request reserves its body's size (its Content-Length, or the route's
// max_body when it is chunked, the rest given back once it is read) before any of it is read. One
// that does not fit waits, first come first served, for up to server.body_timeout (the time its
// body may take to come anyway), and is then answered 503 with Retry-After in its route's shape,
// having read nothing: while it waits its body stays in the socket's buffers, not this
// process's. A body is given back when the upstream's call returns (the fasthttp engine) or the
// request ends (the net/http engine). Other routes, the store's calls and every other client are
// untouched: they hold no body.

// bodyMemoryRetry is the Retry-After of a request whose body did not fit.
const bodyMemoryRetry = time.Second

// bodyMemory is the process's budget of body bytes, kept across reloads (a reload sets its size).
type bodyMemory struct {
	mu      sync.Mutex
	limit   int64     // guarded by mu
	used    int64     // guarded by mu
	waiters list.List // guarded by mu: *bodyWaiter, first come first served
	inUse   prometheus.Gauge
	refused prometheus.Counter
}

type bodyWaiter struct {
	n     int64
	ready chan struct{} // closed when its n bytes are granted (under mu)
}

func newBodyMemory(reg prometheus.Registerer) *bodyMemory {
	b := &bodyMemory{
		inUse: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_body_memory_bytes",
			Help: "Bytes of usage routes' request bodies held in memory now, reserved against server.body_memory."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_body_memory_refused_total",
			Help: "Usage routes' requests answered 503 because their bodies did not fit in server.body_memory within server.body_timeout."}),
	}
	reg.MustRegister(b.inUse, b.refused)
	return b
}

// setLimit sets the budget (a reload's server.body_memory); bodies held keep their bytes.
func (b *bodyMemory) setLimit(n int64) {
	b.mu.Lock()
	b.limit = n
	b.grant()
	b.mu.Unlock()
}

// acquire reserves n bytes, or the whole budget if n is more (a chunked body's max_body and its
// slack may pass a budget of exactly max_body by a few bytes), waiting up to wait for them, and
// returns what it reserved; false: it did not fit in time (counted), and nothing is reserved.
func (b *bodyMemory) acquire(n int64, wait time.Duration) (int64, bool) {
	b.mu.Lock()
	n = min(n, b.limit)
	if b.waiters.Len() == 0 && b.used+n <= b.limit {
		b.used += n
		b.mu.Unlock()
		b.inUse.Add(float64(n))
		return n, true
	}
	w := &bodyWaiter{n: n, ready: make(chan struct{})}
	el := b.waiters.PushBack(w)
	b.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.ready:
		return n, true
	case <-t.C:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted as the wait ran out
		return n, true
	default:
	}
	b.waiters.Remove(el)
	b.grant() // the ones behind it may fit
	b.refused.Inc()
	return 0, false
}

// release gives back n bytes.
func (b *bodyMemory) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.grant()
	b.mu.Unlock()
	b.inUse.Sub(float64(n))
}

// grant hands bytes to the waiters in order while the first fits (under mu).
func (b *bodyMemory) grant() {
	for el := b.waiters.Front(); el != nil; el = b.waiters.Front() {
		w := el.Value.(*bodyWaiter)
		if b.used+w.n > b.limit {
			return
		}
		b.used += w.n
		b.inUse.Add(float64(w.n))
		b.waiters.Remove(el)
		close(w.ready)
	}
}

// heldBody is a request's reservation of body memory; release gives it back once (whichever of
// the upstream's call returning or the request's end comes first).
type heldBody struct {
	b *bodyMemory
	n atomic.Int64 // bytes held; 0 once given back
}

func (h *heldBody) hold(b *bodyMemory, n int64) {
	h.b = b
	h.n.Store(n)
}

// shrink gives back what is held beyond n bytes.
func (h *heldBody) shrink(n int64) {
	if held := h.n.Load(); held > n && h.n.CompareAndSwap(held, n) {
		h.b.release(held - n)
	}
}

func (h *heldBody) release() {
	if n := h.n.Swap(0); n > 0 {
		h.b.release(n)
	}
}
