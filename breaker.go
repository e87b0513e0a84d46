package sluice

import (
	"sync/atomic"
	"time"
)

// breaker stops a dead store from costing its timeout on every decision: after threshold
// consecutive failures it opens, and decisions go straight to the failure mode; after cooldown
// one decision probes the store, and its success closes the breaker (its failure reopens it).
//
// The closed path is two atomic loads and no write, so that a healthy store pays nothing for it.
type breaker struct {
	threshold int32
	cooldown  int64 // ns

	state    atomic.Int32 // breakerClosed, breakerOpen or breakerProbing
	failures atomic.Int32 // consecutive, while closed
	openedAt atomic.Int64 // ns on the monotonic clock, while open

	now func() int64 // monotonic ns; nil: monoNow (tests set a virtual one)
}

func (b *breaker) clock() int64 {
	if b.now != nil {
		return b.now()
	}
	return monoNow()
}

const (
	breakerClosed int32 = iota
	breakerOpen
	breakerProbing
)

// Breaker defaults: trips after 3 consecutive store failures, probes every 250ms, so a store that
// comes back is used again within about a quarter of a second.
const (
	DefaultBreakerThreshold = 3
	DefaultBreakerCooldown  = 250 * time.Millisecond
)

var monoStart = time.Now()

func monoNow() int64 { return int64(time.Since(monoStart)) }

// admit reports whether to ask the store (go), and whether this caller is the probe: true while
// closed, and for the one caller that becomes the probe once the cooldown has passed.
func (b *breaker) admit() (ok, probe bool) {
	switch b.state.Load() {
	case breakerClosed:
		return true, false
	case breakerOpen:
		ok = b.clock()-b.openedAt.Load() >= b.cooldown && b.state.CompareAndSwap(breakerOpen, breakerProbing)
		return ok, ok
	}
	return false, false // a probe is in flight
}

// ready is admit without saying whether the caller is the probe.
func (b *breaker) ready() bool {
	ok, _ := b.admit()
	return ok
}

func (b *breaker) success() {
	if b.state.Load() != breakerClosed || b.failures.Load() != 0 {
		b.failures.Store(0)
		b.state.Store(breakerClosed)
	}
}

func (b *breaker) failure() {
	if b.state.Load() == breakerProbing || b.failures.Add(1) >= b.threshold {
		b.openedAt.Store(b.clock())
		b.state.Store(breakerOpen)
	}
}

// abandon hands the probe back when its call told nothing of the store's health (the caller
// gave up, or the answer did not come from a round trip: see guard.account): the breaker is open
// again with its cooldown already passed, so the next call probes. Only the probe calls it.
func (b *breaker) abandon() { b.state.CompareAndSwap(breakerProbing, breakerOpen) }

// open reports whether the breaker is keeping decisions off the store.
func (b *breaker) open() bool { return b.state.Load() != breakerClosed }
