package gateway

import (
	"log/slog"
	"sync"
	"time"
)

// malformedPerSecond bounds the lines logged about requests that could not be read: a client
// (or a scanner) sending garbage must not be able to flood the log.
const malformedPerSecond = 10

// rateLog logs requests that could not be read: at most limit lines a second, each with the
// client's address and what was wrong in words of its own (never the request's bytes, which can
// hold a credential). The lines over the limit are counted, and a second after the first of them
// one line says how many were left out. The nil rateLog logs nothing.
type rateLog struct {
	log   *slog.Logger
	limit int

	mu         sync.Mutex
	window     time.Time // the start of the current second
	n          int       // lines logged in it
	suppressed int       // lines left out since the last summary
	timer      *time.Timer
}

func newRateLog(log *slog.Logger, limit int) *rateLog { return &rateLog{log: log, limit: limit} }

// warn logs that the request from peer could not be read because of what.
func (r *rateLog) warn(peer, what string) {
	if r == nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	if now.Sub(r.window) >= time.Second {
		r.window, r.n = now, 0
	}
	if r.n < r.limit {
		r.n++
		r.mu.Unlock()
		r.log.Warn("malformed request", "peer", peer, "problem", what)
		return
	}
	r.suppressed++
	if r.timer == nil {
		r.timer = time.AfterFunc(time.Until(r.window.Add(time.Second)), r.summary)
	}
	r.mu.Unlock()
}

// summary logs how many lines were left out.
func (r *rateLog) summary() {
	r.mu.Lock()
	k := r.suppressed
	r.suppressed, r.timer = 0, nil
	r.mu.Unlock()
	if k > 0 {
		r.log.Warn("malformed request: lines suppressed", "suppressed", k, "limit_per_second", r.limit)
	}
}
