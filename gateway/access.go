package gateway

import (
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
)

// accessLog writes a line per request the proxy served (log.access), sampled and bounded in lines
// a second. A line names the client (its configured name, or "anonymous": never a key or a
// token), the method and the path without its query (a query can carry a credential), the
// policies that applied, the decision, the status, the whole request's time (to its end: the
// last byte of its response written, see requestEnd) and the upstream's time to its header, and
// how it ended if its response was not written whole (ended=upstream_cut_short, client_left).
// A nil accessLog logs nothing.
type accessLog struct {
	log     *slog.Logger
	sample  float64
	limit   *rate.Limiter // nil: no bound
	dropped atomic.Uint64 // lines the bound left out
}

func newAccessLog(cfg *config.AccessLog, log *slog.Logger) *accessLog {
	if cfg == nil {
		return nil
	}
	a := &accessLog{log: log, sample: cfg.Sample}
	if cfg.PerSecond > 0 {
		a.limit = rate.NewLimiter(rate.Limit(cfg.PerSecond), max(1, int(cfg.PerSecond)))
	}
	return a
}

// entry is what one access line says.
type entry struct {
	start    time.Time
	req      *decision.Request
	outcome  decision.Outcome
	method   string
	path     string // without the query
	status   int
	upstream time.Duration // 0: not forwarded
	ended    ending        // how the request ended (end.go)
}

// write logs e, if it is sampled and the bound allows.
func (a *accessLog) write(e *entry) {
	if a == nil || (a.sample < 1 && rand.Float64() >= a.sample) {
		return
	}
	if a.limit != nil && !a.limit.Allow() {
		a.dropped.Add(1)
		return
	}
	var policies strings.Builder
	for i, l := range e.req.Limits {
		if i > 0 {
			policies.WriteByte(',')
		}
		policies.WriteString(l.PolicyName)
	}
	args := []any{"client", e.req.Client, "method", e.method, "path", e.path, "policies", policies.String(),
		"decision", e.outcome.String(), "status", e.status, "ms", msOf(time.Since(e.start))}
	if e.upstream > 0 {
		args = append(args, "upstream_ms", msOf(e.upstream))
	}
	switch e.ended {
	case endCut:
		args = append(args, "ended", "upstream_cut_short")
	case endClientLeft:
		args = append(args, "ended", "client_left")
	}
	if n := a.dropped.Swap(0); n > 0 {
		args = append(args, "dropped_before", n) // lines the per_second bound left out since the last one
	}
	a.log.Info("access", args...)
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
