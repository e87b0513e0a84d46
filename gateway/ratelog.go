package gateway

import (
	"log/slog"
	"sync"
	"time"
)

// malformedPerSecond bounds the lines logged about requests that could not be read: a client
// (or a scanner) sending garbage must not be able to flood the log.
const malformedPerSecond = 10

// upstreamPerSecond bounds the lines logged about an upstream that failed (no answer, or an
// answer cut short): an upstream that is down must not flood the log with a line per request.
const upstreamPerSecond = 5

// rateLog logs one kind of trouble (requests that could not be read, an upstream that failed):
// at most limit lines a second, each with where it came from and what was wrong in words of its
// own (never a request's bytes, which can hold a credential). The lines over the limit are
// counted, and a second after the first of them one line says how many were left out. The nil
// rateLog logs nothing.
type rateLog struct {
	log   *slog.Logger
	limit int
	msg   string // the lines' message
	from  string // the name of the field that says where the trouble came from

	mu         sync.Mutex
	window     time.Time // the start of the current second
	n          int       // lines logged in it
	suppressed int       // lines left out since the last summary
	timer      *time.Timer
}

func newRateLog(log *slog.Logger, limit int, msg, from string) *rateLog {
	return &rateLog{log: log, limit: limit, msg: msg, from: from}
}

// warn logs that there was trouble from where (a peer, the upstream), because of what.
func (r *rateLog) warn(where, what string) {
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
		r.log.Warn(r.msg, r.from, where, "problem", what)
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
		r.log.Warn(r.msg+": lines suppressed", "suppressed", k, "limit_per_second", r.limit)
	}
}
