package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// pendingRedis is the Redis store of a gateway that started while Redis did not answer: rather
// than refuse to start (a restart during a Redis outage would then take the gateway down too),
// it serves at once. Until it has connected it answers every decision ErrStoreUnavailable, so the
// configured failure mode decides (fail-closed: 503; fail-open; local) and /readyz says not
// ready; it connects in the background, retrying with backoff, and from then on it is the store.
type pendingRedis struct {
	opts  redisstore.Options
	log   *slog.Logger
	store atomic.Pointer[redisstore.Store]
	stop  chan struct{}
	done  chan struct{}
}

// Backoff between attempts to connect.
var (
	pendingFirstRetry = 250 * time.Millisecond
	pendingMaxRetry   = 5 * time.Second
)

// openRedis opens the Redis store of opts: connected if Redis answers now; if it does not, a
// pendingRedis that connects when it does. Errors that retrying cannot mend (a bad option) are
// returned.
func openRedis(opts redisstore.Options, log *slog.Logger) (sluice.Store, func(context.Context) error, func(), error) {
	rs, err := redisstore.New(opts)
	if err == nil {
		return rs, rs.Ping, rs.Close, nil
	}
	// Only an unreachable Redis is waited for: one that answers with an error (a wrong password,
	// a database it does not have) is a configuration to fix, reported at start.
	var netErr net.Error
	if !errors.Is(err, sluice.ErrStoreUnavailable) || !errors.As(err, &netErr) {
		return nil, nil, nil, err
	}
	log.Warn("Redis does not answer; serving anyway, the failure mode decides until it does", "error", err.Error())
	p := &pendingRedis{opts: opts, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	go p.connect()
	return p, p.Ping, p.Close, nil
}

func (p *pendingRedis) connect() {
	defer close(p.done)
	wait := pendingFirstRetry
	for {
		t := time.NewTimer(wait)
		select {
		case <-p.stop:
			t.Stop()
			return
		case <-t.C:
		}
		rs, err := redisstore.New(p.opts)
		if err == nil {
			p.store.Store(rs)
			p.log.Info("Redis answers; decisions go to it")
			return
		}
		var netErr net.Error
		if !errors.As(err, &netErr) { // it answers, and refuses: say so, and keep trying
			p.log.Error("Redis answers but refuses the connection; the failure mode decides", "error", err.Error())
		}
		wait = min(2*wait, pendingMaxRetry)
	}
}

var errNotConnected = fmt.Errorf("%w: redis store: not connected yet (Redis did not answer at start)", sluice.ErrStoreUnavailable)

func (p *pendingRedis) Decide(ctx context.Context, key string, policy sluice.Policy, cost int64) (sluice.Decision, error) {
	if s := p.store.Load(); s != nil {
		return s.Decide(ctx, key, policy, cost)
	}
	return sluice.Decision{}, errNotConnected
}

func (p *pendingRedis) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if s := p.store.Load(); s != nil {
		return s.DecideAll(ctx, key, limits, out)
	}
	return false, errNotConnected
}

// Ping reports whether the store answers: not before it has connected.
func (p *pendingRedis) Ping(ctx context.Context) error {
	if s := p.store.Load(); s != nil {
		return s.Ping(ctx)
	}
	return errNotConnected
}

// Close stops connecting, and closes the store if it connected.
func (p *pendingRedis) Close() {
	close(p.stop)
	<-p.done
	if s := p.store.Load(); s != nil {
		s.Close()
	}
}
