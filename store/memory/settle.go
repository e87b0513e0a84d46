package memory

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Settle implements sluice.Settler: it settles a charge of reserved on key under p, made by a
// decision at at (Decision.At, µs of the store's clock; sluice.SettleNow: at the settlement's
// instant), with the real cost actual, atomically under the key's shard's and client's locks
// (algorithm.Settle). A key the store no longer holds (idle, swept, evicted) has nothing to
// refund; an extra charge starts its state.
func (s *Store) Settle(_ context.Context, key string, p sluice.Policy, at, reserved, actual int64) error {
	if err := p.Validate(); err != nil {
		return err
	}
	now := s.now()
	if at == sluice.SettleNow {
		at = now
	}
	h := s.hash.String(key) & s.hashMask
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.find(h, key)
	var sl *slot
	if c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		sl = c.find(p.Name)
	}
	if sl != nil {
		changed, err := algorithm.Settle(&p, &sl.state, at, now, reserved, actual)
		if changed {
			sl.expires = expiresAt(now, peekReset(&p, &sl.state, now))
		}
		return err
	}
	var st algorithm.State
	changed, err := algorithm.Settle(&p, &st, at, now, reserved, actual)
	if err != nil || !changed {
		return err
	}
	if sh.slots >= s.maxPerShard && !s.makeRoomLocked(sh, now, []*client{c}) {
		return s.errFull(&p)
	}
	sh.addLocked(c, h, key, slot{policy: p.Name, expires: expiresAt(now, peekReset(&p, &st, now)), state: st}, false)
	return nil
}

// SettleOnce implements sluice.OnceSettler: it is Settle, and ignores id and keep. A settlement
// here is made in process, under the key's locks, and its outcome is never unknown: nil means it
// was applied, an error that nothing changed. So a settlement attempted again after an error is
// applied once, and no record of ids is needed (nor memory spent on one).
func (s *Store) SettleOnce(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64, _ string, _ time.Duration) error {
	return s.Settle(ctx, key, p, at, reserved, actual)
}

// peekReset is the ResetAfter of state s at now: when it will be as if never seen.
func peekReset(p *sluice.Policy, s *algorithm.State, now int64) time.Duration {
	var d sluice.Decision
	algorithm.DecideInto(p, s, now, 0, &d) // a peek changes nothing
	return d.ResetAfter
}

var _ sluice.OnceSettler = (*Store)(nil)
