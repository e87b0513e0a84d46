package gateway

import (
	"context"
	"log/slog"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

func init() { testReplayer = sim.Replay } // (the composition root gives it in serve)

// SetUpstreamIdle sets how long the upstream may be silent, for a test; it returns the old value.
func SetUpstreamIdle(d time.Duration) time.Duration {
	old := upstreamIdle
	upstreamIdle = d
	return old
}

// SetHeaderTimeout sets how long the listener waits for a request's header, for a test; it
// returns the old value.
func SetHeaderTimeout(d time.Duration) time.Duration {
	old := headerTimeout
	headerTimeout = d
	return old
}

// SetAdminTimeouts sets the admin listener's bound on a whole request, on an answer and on an
// idle connection (its header's is SetHeaderTimeout's), for a test; it returns a function that
// puts the old ones back. Like SetHeaderTimeout, it applies to servers made after it.
func SetAdminTimeouts(read, write, idle time.Duration) (restore func()) {
	r, w, i := adminReadTimeout, adminWriteTimeout, idleTimeout
	adminReadTimeout, adminWriteTimeout, idleTimeout = read, write, idle
	return func() { adminReadTimeout, adminWriteTimeout, idleTimeout = r, w, i }
}

// OpenStore opens the store cfg describes, guarded by its failure mode, as cmd/sluice's
// composition root does (the gateway itself imports no store): the tests' way to a Server.
func OpenStore(cfg config.Store, log *slog.Logger) (Store, error) {
	var st Store
	var fleet *redisstore.Fleet
	var mopts []memory.Option
	if cfg.MaxKeys > 0 {
		mopts = append(mopts, memory.WithMaxKeys(cfg.MaxKeys))
	}
	switch cfg.Type {
	case config.StoreRedis:
		negCache := cfg.RefusalCache // 0 is off: the store's -1
		if negCache == 0 {
			negCache = -1
		}
		rs, err := redisstore.New(redisstore.Options{Addrs: cfg.Addrs, URL: cfg.URL, Username: cfg.Username,
			Password: cfg.Password.Value(), Prefix: cfg.Prefix, Timeout: cfg.Timeout, Logger: log, NegativeCacheSize: negCache})
		if err != nil {
			return st, err
		}
		st = Store{Store: rs, Ping: rs.Ping, Close: rs.Close}
		// Every Redis store runs the registry, its heartbeats carrying the approvals (Shares).
		shares := NewShares()
		counts := func() []redisstore.FleetCount {
			var out []redisstore.FleetCount
			for _, c := range shares.Counts(time.Now()) {
				out = append(out, redisstore.FleetCount{Client: c.Client, Policy: c.Policy, Period: c.Period, Window: c.Window,
					Current: c.Current, Previous: c.Previous, Allowed: c.Allowed})
			}
			return out
		}
		if fleet, err = rs.Fleet(redisstore.FleetOptions{Name: cfg.Fleet, Counts: counts}); err != nil {
			rs.Close()
			return st, err
		}
		fleet.Start()
		st.Close = func() { fleet.Close(); rs.Close() }
		st.FleetHistory = &FleetHistory{Add: fleet.AddHistory, Read: fleet.History} // the fleet's last hour (GET /v1/history)
		st.Shares = shares
		st.Fleet = func() FleetStats {
			v := fleet.View()
			share := 0.0
			switch {
			case cfg.OnError == sluice.FailLocal && cfg.LocalShare == config.LocalShareFleet:
				share = 1 / float64(fleet.Size())
			case cfg.OnError == sluice.FailLocal:
				share = cfg.LocalShare
			}
			f := FleetStats{Name: fleet.Name(), Self: v.Self, Instances: v.Count, FallbackShare: share, Error: v.Err, Members: []FleetInstance{}}
			for _, in := range v.Instances {
				m := FleetInstance{ID: in.ID, LastSeen: in.LastSeen, Dropped: in.Dropped}
				for _, c := range in.Counts {
					m.Counts = append(m.Counts, ShareCount{Client: c.Client, Policy: c.Policy, Period: c.Period, Window: c.Window,
						Current: c.Current, Previous: c.Previous, Allowed: c.Allowed})
				}
				f.Members = append(f.Members, m)
			}
			if !v.At.IsZero() {
				f.SeenAt = &v.At
			}
			return f
		}
	default:
		st.Store = memory.New(mopts...)
	}
	opts := []sluice.Option{sluice.WithFailureMode(cfg.OnError)}
	switch {
	case fleet != nil && cfg.OnError == sluice.FailLocal && cfg.LocalShare == config.LocalShareFleet:
		opts = []sluice.Option{sluice.WithFleetFallback(memory.New(mopts...), fleet.Size)}
	case cfg.OnError == sluice.FailLocal:
		opts = []sluice.Option{sluice.WithLocalFallback(memory.New(mopts...), cfg.LocalShare)}
	}
	guarded, err := sluice.Guard(st.Store, opts...)
	if err != nil {
		return st, err
	}
	st.Store = guarded
	return st, nil
}

// NewTestServer is NewServer on the store of cfg (OpenStore).
func NewTestServer(cfg *config.Config, path string, log *slog.Logger) (*Server, error) {
	st, err := OpenStore(cfg.Store, log)
	if err != nil {
		return nil, err
	}
	return NewServer(cfg, path, st, log)
}

// SetWatchDelay sets how long a request is in flight before its client is watched, until the
// test ends.
func SetWatchDelay(t interface{ Cleanup(func()) }, d time.Duration) {
	old := watchDelay
	watchDelay = d
	t.Cleanup(func() { watchDelay = old })
}

// NewClockedServer is NewServer on a memory store that reads clock, with the Server's own
// record of decisions (the operator page's activity, the clients' needs) on it too: a test
// feeds it days of traffic without waiting.
func NewClockedServer(cfg *config.Config, clock *sluice.ManualClock) (*Server, error) {
	s, err := NewServer(cfg, "", Store{Store: memory.New(memory.WithClock(clock))}, slog.New(slog.DiscardHandler))
	if err == nil {
		s.SetClock(clock.Now)
	}
	return s, err
}

// SetClock has the Server record decisions (and fold its history, which starts at now()) at
// now's time; its history's
// loop is stopped while it changes, so that no fold reads the clock meanwhile.
func (s *Server) SetClock(now func() time.Time) {
	close(s.historyStop)
	<-s.historyDone
	s.metrics.now = now
	s.history.start = slotOf(now())
	s.historyStop, s.historyDone = make(chan struct{}), make(chan struct{})
	go s.runHistory(s.historyStop, s.historyDone)
}

// FoldHistory folds the slots that have ended into the Server's history (and the fleet's), as
// its loop does every few seconds.
func FoldHistory(s *Server) { s.foldHistory(context.Background()) }

// History is the length of a history slot and the slots kept.
const (
	HistoryResolution = historyResolution
	HistorySlots      = historySlots
)

// NeedsKept returns how many clients the Server keeps needs of, and how many series (client and
// policy) and minute pages they hold.
func NeedsKept(s *Server) (clients, series, pages int) {
	m := s.metrics.needs.clients.Load()
	if m == nil {
		return 0, 0, 0
	}
	for _, c := range *m {
		for _, sr := range c.all() {
			series++
			sr.mu.Lock()
			for _, pg := range sr.pages {
				if pg != nil {
					pages++
				}
			}
			sr.mu.Unlock()
		}
	}
	return len(*m), series, pages
}

// RecordNeeds records a decided request in the Server's needs, as its observer does.
func RecordNeeds(s *Server, req *decision.Request, v *decision.Verdict, now time.Time) {
	s.metrics.needs.decided(req, v, now)
}

// MaxNeedsClients is the most clients whose needs are kept.
const MaxNeedsClients = maxNeedsClients

// NeedPageBytes is the size the documentation gives a minute page, and its real size.
func NeedPageBytes() (documented, real uintptr) { return needPageBytes, unsafe.Sizeof(needPage{}) }

// PoliciesOf returns what the Server's running Gateway resolves requests with.
func PoliciesOf(s *Server) *decision.Policies { return s.current.Load().policies }
