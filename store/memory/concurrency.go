package memory

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Concurrency policies: a key's slots are its state's leases (algorithm.Lease), at most the
// policy's limit of them live, each dropped when it expires, is released, or the key is swept
// once its last lease has expired. Like any state, a key of a concurrency policy may be evicted at
// the key bound (WithMaxKeys): its slots then come back early, which errs towards admitting.

// decideLimit decides limit l on *st at now: a concurrency policy takes its slots under l.Lease,
// the others decide as Decide does.
func decideLimit(l *sluice.Limit, st *algorithm.State, now int64, d *sluice.Decision) error {
	if l.Policy.Algorithm == sluice.Concurrency {
		return algorithm.Acquire(&l.Policy, st, now, l.Lease, l.Cost, d)
	}
	return algorithm.DecideWithin(&l.Policy, st, now, l.Cost, l.MaxDelayMicros(), d)
}

// Release implements sluice.Leaser. It never fails.
func (s *Store) Release(_ context.Context, key string, p sluice.Policy, id uint64) error {
	s.withSlot(key, p.Name, func(sl *slot, now int64) { algorithm.Release(&sl.state, now, id) })
	return nil
}

// Renew implements sluice.Leaser. It never fails.
func (s *Store) Renew(_ context.Context, key string, p sluice.Policy, ids ...uint64) error {
	s.withSlot(key, p.Name, func(sl *slot, now int64) {
		if algorithm.Renew(&p, &sl.state, now, ids...) > 0 {
			sl.expires = max(sl.expires, algorithm.LastExpiry(&sl.state))
		}
	})
	return nil
}

// withSlot runs f on the state of key under policy, if the store holds one, under its shard's and
// its client's locks.
func (s *Store) withSlot(key, policy string, f func(sl *slot, now int64)) {
	now := s.now()
	h := s.hash.String(key) & s.hashMask
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c := sh.find(h, key); c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		if sl := c.find(policy); sl != nil {
			f(sl, now)
		}
	}
}

var _ sluice.Leaser = (*Store)(nil)
