package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clients"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// openStore opens the store cfg describes and guards it with its failure mode (on_error): the
// composition root's one place that knows the store packages.
//
// A Redis store serves even while Redis does not answer (a restart during a Redis outage would
// otherwise take the gateway down too): it connects in the background, answering every decision
// ErrStoreUnavailable until it has — so the failure mode decides (fail-closed: 503; fail-open;
// local) and /readyz says not ready — and logs when Redis did not answer and when it does. Errors
// that retrying cannot mend (a bad option, a Redis that refuses the connection) are returned.
//
// Policies with a local_budget are served from budgets taken from Redis (sluice.Budgeted, under
// the guard, so that a failed take meets the failure mode); budgets says which, at every
// decision, following reloads. The memory store is one process: nothing to take budgets from.
//
// Every Redis store runs the instance registry (store/redis Fleet) of its fleet (store.fleet:
// only instances of one name count each other): its heartbeats carry this instance's approvals
// per client (gateway.Shares, which the Server fills) and read every instance's, for the
// diagnosis; and with local_share: fleet its count is the local fallback's share. A heartbeat
// that fails harms no decision: the registry logs it once and keeps the last count seen.
func openStore(cfg config.Store, log *slog.Logger, budgets func(sluice.Policy) sluice.LocalBudget) (gateway.Store, error) {
	st, _, err := openStoreRegional(cfg, log, budgets)
	return st, err
}

// regionalStore is the Redis store openStoreRegional opened, and this instance's entry in its
// fleet registry: a region's instances pool their global policies there (startRegion).
type regionalStore struct {
	store *redisstore.Store
	fleet *redisstore.Fleet
}

// openStoreRegional is openStore, with the Redis store it opened (nil fields for the memory store).
func openStoreRegional(cfg config.Store, log *slog.Logger, budgets func(sluice.Policy) sluice.LocalBudget) (gateway.Store, regionalStore, error) {
	var st gateway.Store
	var fleet *redisstore.Fleet
	var reg regionalStore
	fleetShare := cfg.OnError == sluice.FailLocal && cfg.LocalShare == config.LocalShareFleet
	switch cfg.Type {
	case config.StoreRedis:
		rs, err := redisstore.New(redisOptions(cfg, log))
		if err != nil {
			return st, reg, err
		}
		st = gateway.Store{Store: rs, Ping: rs.Ping, Close: rs.Close}
		if budgets != nil {
			st.Store = sluice.Budgeted(rs, budgets)
		}
		shares := gateway.NewShares()
		if fleet, err = rs.Fleet(redisstore.FleetOptions{Name: cfg.Fleet, Counts: fleetCounts(shares), LogShare: fleetShare}); err != nil {
			rs.Close()
			return st, reg, err
		}
		fleet.Start()
		reg = regionalStore{store: rs, fleet: fleet}
		st.Close = func() { fleet.Close(); rs.Close() } // leave the registry first: the others count one fewer at once
		share := fallbackShare(cfg)
		st.Fleet = func() gateway.FleetStats { return fleetStats(fleet, share) }
		st.FleetHistory = &gateway.FleetHistory{Add: fleet.AddHistory, Read: fleet.History} // the fleet's last hour (GET /v1/history)
		st.Shares = shares
		st.Clients = rs.Registry()
	default:
		st.Store = memory.New(memoryOptions(cfg)...)
	}
	opts := []sluice.Option{sluice.WithFailureMode(cfg.OnError)}
	switch {
	case fleet != nil && fleetShare:
		opts = []sluice.Option{sluice.WithFleetFallback(memory.New(memoryOptions(cfg)...), fleet.Size)}
	case cfg.OnError == sluice.FailLocal:
		opts = []sluice.Option{sluice.WithLocalFallback(memory.New(memoryOptions(cfg)...), cfg.LocalShare)}
	}
	guarded, err := sluice.Guard(st.Store, opts...)
	if err != nil {
		if st.Close != nil {
			st.Close()
		}
		return st, regionalStore{}, err
	}
	st.Store = guarded
	return st, reg, nil
}

// fallbackShare is the local fallback's share of each policy of cfg: -1 for local_share: fleet
// (1/instances, read at each call), 0 without a local fallback.
func fallbackShare(cfg config.Store) float64 {
	switch {
	case cfg.OnError != sluice.FailLocal:
		return 0
	case cfg.LocalShare == config.LocalShareFleet:
		return -1
	}
	return cfg.LocalShare
}

// fleetCounts is what the registry's heartbeats carry: this instance's approvals, as counted now.
func fleetCounts(s *gateway.Shares) func() []redisstore.FleetCount {
	return func() []redisstore.FleetCount {
		cs := s.Counts(time.Now())
		out := make([]redisstore.FleetCount, len(cs))
		for i, c := range cs {
			out[i] = redisstore.FleetCount{Client: c.Client, Policy: c.Policy, Period: c.Period, Window: c.Window,
				Current: c.Current, Previous: c.Previous, Allowed: c.Allowed}
		}
		return out
	}
}

// fleetStats is the registry as f last read it, as /v1/stats shows it; share is fallbackShare's.
func fleetStats(f *redisstore.Fleet, share float64) gateway.FleetStats {
	v := f.View()
	if share < 0 {
		share = 1 / float64(f.Size())
	}
	st := gateway.FleetStats{Name: f.Name(), Self: v.Self, Instances: v.Count, FallbackShare: share, Error: v.Err,
		Members: make([]gateway.FleetInstance, len(v.Instances))}
	for i, in := range v.Instances {
		m := gateway.FleetInstance{ID: in.ID, LastSeen: in.LastSeen, Dropped: in.Dropped}
		for _, c := range in.Counts {
			m.Counts = append(m.Counts, gateway.ShareCount{Client: c.Client, Policy: c.Policy, Period: c.Period, Window: c.Window,
				Current: c.Current, Previous: c.Previous, Allowed: c.Allowed})
		}
		st.Members[i] = m
	}
	if !v.At.IsZero() {
		st.SeenAt = &v.At
	}
	return st
}

// runningBudgets is the local budgets of the running configuration: cfg's until srv is set,
// then the server's, which follow its reloads.
func runningBudgets(cfg *config.Config, srv *atomic.Pointer[gateway.Server]) func(sluice.Policy) sluice.LocalBudget {
	return func(p sluice.Policy) sluice.LocalBudget {
		if s := srv.Load(); s != nil {
			return s.Config().LocalBudget(p.Name)
		}
		return cfg.LocalBudget(p.Name)
	}
}

// redisOptions are the Redis store's options of cfg.
func redisOptions(cfg config.Store, log *slog.Logger) redisstore.Options {
	o := redisstore.Options{
		Addrs: cfg.Addrs, URL: cfg.URL, Username: cfg.Username, Password: cfg.Password.Value(),
		Prefix: cfg.Prefix, Timeout: cfg.Timeout, SlowTimeout: cfg.SlowTimeout, Logger: log, NegativeCacheSize: refusalCache(cfg.RefusalCache),
		ReplicasAck: cfg.ReplicasAck, ReplicasAckTimeout: cfg.ReplicasAckTimeout,
	}
	if sn := cfg.Sentinel; sn != nil {
		o.Sentinel = &redisstore.Sentinel{Master: sn.Master, Addrs: sn.Addrs, Username: sn.Username, Password: sn.Password.Value()}
	}
	return o
}

// memoryOptions are the options of the memory store of cfg: the store itself (type memory), or
// the local fallback (on_error local).
func memoryOptions(cfg config.Store) []memory.Option {
	if cfg.MaxKeys > 0 {
		return []memory.Option{memory.WithMaxKeys(cfg.MaxKeys)}
	}
	return nil
}

// refusalCache is store.refusal_cache as the Redis store's option: 0 (off) is negative there.
func refusalCache(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// startClients runs the clients API's records beside the file's clients on srv: kept in the
// Redis store's registry (st.Clients), or, on the memory store, in this process and
// admin.clients_file if set. It reads them once (a Redis that does not answer yet is read when
// it does), and keeps them current until ctx ends. The returned function closes what it opened.
func startClients(ctx context.Context, cfg *config.Config, st gateway.Store, srv *gateway.Server, log *slog.Logger) (func(), error) {
	b := st.Clients
	closer := func() {}
	if b == nil {
		mb, err := clients.NewMemoryBackend(cfg.Admin.ClientsFile)
		if err != nil {
			return nil, configError{fmt.Errorf("%s: admin.clients_file: %w", cfg.File, err)}
		}
		b, closer = mb, func() { mb.Close() }
		if cfg.AdminListen != "" && cfg.Admin.ClientsFile == "" && cfg.Admin.HasToken() { // (without a token nothing can be written)
			log.Info("the clients API keeps its records in memory: they are gone at a restart (admin.clients_file keeps them)")
		}
	}
	m := clients.NewManager(b, cfg.Admin.ClientsPoll, log)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := m.Sync(sctx)
	cancel()
	if err != nil {
		log.Warn("clients registry: not read at the start; its clients run once the store answers", "error", err.Error())
	}
	if err := srv.UseClients(m); err != nil {
		closer()
		return nil, failure{err}
	}
	go m.Run(ctx)
	return closer, nil
}

// startRegion runs the region's refresher of the global: true policies (issue 34), when cfg has
// a region section: on the global Redis, in the background, its allotments the decisions' limits
// (st.Global); st.Close stops it and closes that Redis, then the store. On the region's Redis
// (reg) it pools with the region's other instances: one of them refreshes the ledger for the
// region, every one enforces the grant it publishes (region.Refresher.UsePool).
func startRegion(cfg *config.Config, log *slog.Logger, st *gateway.Store, reg regionalStore) error {
	if cfg.Region == nil {
		return nil
	}
	gs, err := redisstore.New(redisOptions(cfg.Region.Global, log))
	if err != nil {
		return fmt.Errorf("region %s: the global Redis: %w", cfg.Region.Name, err)
	}
	ref, err := region.New(gs, cfg, log)
	if err != nil {
		gs.Close()
		return err
	}
	if reg.store != nil {
		if err := ref.UsePool(reg.store, reg.fleet.ID()); err != nil {
			gs.Close()
			return err
		}
	}
	ref.Start()
	st.Global = ref
	st.Regions = func() gateway.RegionStats { return gateway.RegionStats{Region: ref.Name(), Policies: ref.Stats()} }
	closeStore := st.Close
	st.Close = func() {
		ref.Close()
		gs.Close()
		if closeStore != nil {
			closeStore()
		}
	}
	return nil
}
