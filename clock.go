package sluice

import (
	"context"
	"sync"
	"time"
)

// ManualClock is a Clock that moves only when told to: for tests and simulations, so that
// nothing ever sleeps to wait for a rate limit. It is safe for concurrent use. Its Sleep fits
// WithSleep: it advances the clock instead of waiting.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time // guarded by mu
}

// NewManualClock returns a clock that reads t until moved.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (backward too: stores then treat a key's time as not running backward).
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Sleep advances the clock by d at once, unless ctx has ended.
func (c *ManualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}
