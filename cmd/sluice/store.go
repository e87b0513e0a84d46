package main

import (
	"log/slog"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
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
func openStore(cfg config.Store, log *slog.Logger) (gateway.Store, error) {
	var st gateway.Store
	switch cfg.Type {
	case config.StoreRedis:
		rs, err := redisstore.New(redisOptions(cfg, log))
		if err != nil {
			return st, err
		}
		st = gateway.Store{Store: rs, Ping: rs.Ping, Close: rs.Close}
	default:
		st.Store = memory.New(memoryOptions(cfg)...)
	}
	opts := []sluice.Option{sluice.WithFailureMode(cfg.OnError)}
	if cfg.OnError == sluice.FailLocal {
		opts = []sluice.Option{sluice.WithLocalFallback(memory.New(memoryOptions(cfg)...), cfg.LocalShare)}
	}
	guarded, err := sluice.Guard(st.Store, opts...)
	if err != nil {
		if st.Close != nil {
			st.Close()
		}
		return st, err
	}
	st.Store = guarded
	return st, nil
}

// redisOptions are the Redis store's options of cfg.
func redisOptions(cfg config.Store, log *slog.Logger) redisstore.Options {
	o := redisstore.Options{
		Addrs: cfg.Addrs, URL: cfg.URL, Username: cfg.Username, Password: cfg.Password.Value(),
		Prefix: cfg.Prefix, Timeout: cfg.Timeout, Logger: log, NegativeCacheSize: refusalCache(cfg.RefusalCache),
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
