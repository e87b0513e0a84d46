package decision

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// CONCURRENCY SLOTS. A request under a concurrency policy takes one slot of it (whatever its
// cost: a route's cost counts units of rate, not requests in flight; a cost of 0 peeks), under a
// lease drawn for it, in the same store call as its rate limits, all or nothing. The Verdict
// remembers the slots it took. A front end that sees the response end (the proxy's two engines)
// marks the request Releases and calls ReleaseSlots at the request's end (the gateway's
// requestEnd: the last byte of the response written, a stream's or a tunnel's included, or the
// client or the upstream gone): until then the Decider's Renewer renews the leases, so a slow request keeps
// its slots, and if the instance dies they come back after the lease time.
//
// The front ends that cannot see the response end (the decision API, forward-auth, Envoy's rate
// limit service) leave Releases false: their requests' slots are held for one lease time, neither
// renewed nor given back. So there a concurrency policy admits at most its limit per lease time,
// which keeps at most that many in flight as long as requests take less than the lease.

// Renewer renews the leases of the requests in flight whose front end will release them: one
// goroutine for all of them, running only while there are some, renewing every third of the
// shortest lease among them. It is safe for concurrent use.
type Renewer struct {
	mu      sync.Mutex
	held    map[*heldSlots]struct{} // guarded by mu
	running bool                    // guarded by mu: the goroutine runs
	every   time.Duration           // guarded by mu: a third of the shortest lease held since it started
	// wake (guarded by mu; made once) cuts the goroutine's wait short when a request brings a
	// shorter lease than the one the wait was drawn for: that lease would expire first.
	wake chan struct{}

	// Timeout bounds each round of renewals (default: a third of the shortest lease).
	Timeout time.Duration

	manual bool                                 // tests: no goroutine; they call RenewNow
	after  func(time.Duration) <-chan time.Time // tests: the goroutine's waits; nil: time.After
}

// heldSlots are the slots a Verdict took.
type heldSlots struct {
	store  sluice.Leaser
	leases []heldLease
	r      *Renewer // nil: not renewed
}

type heldLease struct {
	key    string
	policy sluice.Policy
	id     uint64
}

// takeSlots gives each concurrency limit of a request a lease and its cost, one slot (0 peeks),
// and reports whether there are any.
func takeSlots(limits []sluice.Limit) bool {
	any := false
	for i := range limits {
		if l := &limits[i]; l.Policy.Algorithm == sluice.Concurrency {
			l.Cost = min(l.Cost, 1)
			l.Lease = sluice.NewLeaseID()
			any = true
		}
	}
	return any
}

// holdSlots makes v remember the slots its limits took (those allowed, with a cost, that the
// store decided: a fail-open decision took none), and has them renewed if the front end will
// release them.
func (d *Decider) holdSlots(req *Request, v *Verdict, limits []sluice.Limit, out []sluice.Decision) {
	store, ok := d.Store.(sluice.Leaser)
	if !ok {
		return
	}
	var h *heldSlots
	for i := range limits {
		l := &limits[i]
		if l.Policy.Algorithm != sluice.Concurrency || l.Cost == 0 || !out[i].Allowed || out[i].Fallback == sluice.FallbackOpen {
			continue
		}
		if h == nil {
			h = &heldSlots{store: store}
		}
		h.leases = append(h.leases, heldLease{key: l.EffectiveKey(req.Who.Key), policy: l.Policy, id: l.Lease})
	}
	if h == nil {
		return
	}
	v.slots = h
	if req.Releases && d.Renewer != nil {
		d.Renewer.add(h)
	}
}

// ReleaseSlots gives back the concurrency slots v took, if any, and stops their renewal: the
// proxy calls it when the upstream's response is written or the client left (before
// v.Release). It is a no-op for a Verdict without slots, and after the first call. A slot the
// store cannot give back now (it is unreachable) expires after its lease.
func (d *Decider) ReleaseSlots(ctx context.Context, v *Verdict) {
	h := v.slots
	if h == nil {
		return
	}
	v.slots = nil
	if h.r != nil {
		h.r.remove(h)
	}
	ctx = context.WithoutCancel(ctx) // the client may have left: the slots are given back all the same
	for _, l := range h.leases {
		_ = h.store.Release(ctx, l.key, l.policy, l.id)
	}
}

func (r *Renewer) add(h *heldSlots) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h.r = r
	if r.held == nil {
		r.held = map[*heldSlots]struct{}{}
	}
	r.held[h] = struct{}{}
	shorter := false
	for _, l := range h.leases {
		if every := l.policy.Period / 3; r.every == 0 || every < r.every {
			r.every, shorter = every, true
		}
	}
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	switch {
	case r.manual:
	case !r.running:
		r.running = true
		go r.run()
	case shorter: // the goroutine waits a third of a longer lease: renew now, then every r.every
		select {
		case r.wake <- struct{}{}:
		default: // (already woken)
		}
	}
}

func (r *Renewer) remove(h *heldSlots) {
	r.mu.Lock()
	delete(r.held, h)
	r.mu.Unlock()
}

// InFlight returns how many requests' slots are being renewed.
func (r *Renewer) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// run renews every r.every until no slots are held, and at once when woken.
func (r *Renewer) run() {
	after := r.after
	if after == nil {
		after = time.After
	}
	for {
		r.mu.Lock()
		every, wake := r.every, r.wake
		r.mu.Unlock()
		select {
		case <-after(every): // a period to wait, not synchronisation
		case <-wake:
		}
		r.mu.Lock()
		if len(r.held) == 0 {
			r.running, r.every = false, 0
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.RenewNow(context.Background())
	}
}

// renewKey is the leases of one key and policy, renewed in one call.
type renewKey struct {
	store  sluice.Leaser
	key    string
	policy string
}

// RenewNow renews the leases of every request registered, one store call per key and policy.
func (r *Renewer) RenewNow(ctx context.Context) {
	type batch struct {
		p   sluice.Policy
		ids []uint64
	}
	r.mu.Lock()
	batches := map[renewKey]*batch{}
	timeout := r.Timeout
	for h := range r.held {
		for _, l := range h.leases {
			k := renewKey{h.store, l.key, l.policy.Name}
			b := batches[k]
			if b == nil {
				b = &batch{p: l.policy}
				batches[k] = b
			}
			b.ids = append(b.ids, l.id)
			if t := l.policy.Period / 3; timeout == 0 || t < timeout {
				timeout = t
			}
		}
	}
	r.mu.Unlock()
	if len(batches) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wg sync.WaitGroup
	for k, b := range batches {
		wg.Go(func() { _ = k.store.Renew(ctx, k.key, b.p, b.ids...) })
	}
	wg.Wait()
}
