package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
	"github.com/sluicehq/sluice/rls/xds"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// rlsServer is Envoy's rate limit service as sluice serve runs it: the service (on the gateway's
// decision layer, store and metrics), its gRPC server and the gRPC health service, and the xDS
// subscription its rules come from, if they do.
type rlsServer struct {
	svc    *rls.Service
	quota  *rlqs.Service // nil: rls.quota is not set
	grpc   *grpc.Server
	health *health.Server
	xds    *xds.Client // nil: the rules are files
}

// startRLS makes the rate limit service of cfg.RLS (nil if cfg has none). With files, every
// reload of srv reads them again: a reload whose files are invalid fails whole, and the running
// configuration stays. With rls.xds, the subscription starts here and each update it receives is
// applied as a reload; the service answers every request with an error until the first. Whether
// the service runs, where it listens and where its rules come from change at a restart.
//
// With rls.quota, the Rate Limit Quota Service (StreamRateLimitQuotas) is served on the same
// listener, its buckets' ledgers from ledgers; its rules change with every reload (whether it
// runs, at a restart).
func startRLS(cfg *config.Config, srv *gateway.Server, ledgers ledger.Ledgers, log *slog.Logger) (*rlsServer, error) {
	if cfg.RLS == nil {
		srv.OnReload(func(c *config.Config) (func(), error) {
			if c.RLS != nil {
				log.Warn("rls takes effect at the next restart: the rate limit service is not running", "file", c.File)
			}
			return nil, nil
		})
		return nil, nil
	}
	var conf *envoyconf.Config
	if cfg.RLS.XDS == nil && len(cfg.RLS.EnvoyConfig) > 0 {
		var err error
		if conf, err = envoyconf.Load(cfg.RLS.EnvoyConfig...); err != nil {
			return nil, configError{err}
		}
	}
	svc := rls.New(conf, srv.Decide)
	svc.SetLegacyHeaders(cfg.Limits.LegacyHeaders)
	var opts []grpc.ServerOption
	if cfg.RLS.Quota != nil {
		opts = append(opts, grpc.MaxRecvMsgSize(rlqs.MaxMessage)) // an Envoy's report of all its buckets
	}
	gs, hs := svc.Server(opts...)
	r := &rlsServer{svc: svc, grpc: gs, health: hs}
	if q := cfg.RLS.Quota; q != nil {
		r.quota = rlqs.New(q, rlqs.Options{Ledgers: ledgers, Log: log})
		r.quota.Register(gs)
		hs.SetServingStatus(rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
		srv.SetQuota(r.quota)
	}
	if x := cfg.RLS.XDS; x != nil {
		var err error
		if r.xds, err = startXDS(x, svc, srv, log); err != nil {
			return nil, configError{err}
		}
	}
	running := *cfg.RLS
	srv.OnReload(func(c *config.Config) (func(), error) {
		if c.RLS == nil {
			log.Warn("rls was removed; the rate limit service runs until the next restart, on its rules as they are now", "file", c.File)
			c.RLS = &running
		} else if c.RLS.Listen != running.Listen {
			log.Warn("rls.listen takes effect at the next restart; the running one stays", "file", c.File, "listen", running.Listen)
			c.RLS.Listen = running.Listen
		}
		if !sameXDS(c.RLS.XDS, running.XDS) {
			log.Warn("rls.xds (and whether the rules come from files or xDS) takes effect at the next restart; the running source stays", "file", c.File)
			c.RLS.XDS, c.RLS.EnvoyConfig, c.RLS.EnvoyLines = running.XDS, running.EnvoyConfig, running.EnvoyLines
		}
		if (c.RLS.Quota == nil) != (running.Quota == nil) {
			log.Warn("rls.quota (whether the quota service runs) takes effect at the next restart", "file", c.File)
		}
		quota := func() {
			if r.quota != nil && c.RLS.Quota != nil {
				r.quota.Swap(c.RLS.Quota)
			}
		}
		if running.XDS != nil { // the rules are the subscription's
			return func() { svc.SetLegacyHeaders(c.Limits.LegacyHeaders); quota() }, nil
		}
		var conf *envoyconf.Config
		if len(c.RLS.EnvoyConfig) > 0 {
			var err error
			if conf, err = envoyconf.Load(c.RLS.EnvoyConfig...); err != nil {
				return nil, err
			}
		}
		files := slices.Clone(c.RLS.EnvoyConfig)
		return func() {
			if conf != nil {
				svc.Swap(conf)
			}
			svc.SetLegacyHeaders(c.Limits.LegacyHeaders)
			quota()
			log.Info("Envoy rate limit service configuration reloaded", "envoy_config", fmt.Sprint(files))
		}, nil
	})
	return r, nil
}

// startXDS subscribes svc to the management server of x, its metrics on srv's registry.
func startXDS(x *config.XDS, svc *rls.Service, srv *gateway.Server, log *slog.Logger) (*xds.Client, error) {
	o := xds.Options{Server: x.Server, NodeID: x.NodeID, NodeMetadata: x.NodeMetadata,
		RetryInitial: x.RetryInitial, RetryMax: x.RetryMax, Log: log, Registerer: srv.Registry()}
	if t := x.TLS; t != nil {
		var err error
		if o.TLS, err = xds.TLSConfig(t.CA, t.Cert, t.Key, t.ServerName); err != nil {
			return nil, err
		}
	}
	return xds.Start(o, svc.Swap)
}

// sameXDS reports whether a and b subscribe alike (wherever they are written).
func sameXDS(a, b *config.XDS) bool {
	if a == nil || b == nil {
		return a == b
	}
	a2, b2 := *a, *b
	a2.Line, b2.Line = 0, 0
	return reflect.DeepEqual(a2, b2)
}

// stop says NOT_SERVING on the health service, ends the xDS subscription, lets the calls in
// flight finish until ctx is done, then cuts them.
func (r *rlsServer) stop(ctx context.Context) {
	r.health.Shutdown()
	if r.quota != nil {
		r.quota.Close() // its streams never end by themselves
	}
	if r.xds != nil {
		r.xds.Stop()
	}
	done := make(chan struct{})
	go func() { r.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.grpc.Stop()
		<-done
	}
}

// rlsTLS wraps the rate limit service's listener ln in t's TLS (nil: ln as it is). gRPC clients
// want ALPN's h2; with t.ClientCAFile every connection must present a certificate those CAs
// signed, as envoyproxy/ratelimit's GRPC_CLIENT_TLS_CACERT has it: the service has no probe that
// needs to get in without one (the gRPC health service is for its clients).
func rlsTLS(ln net.Listener, t *config.TLS) (net.Listener, error) {
	if t == nil {
		return ln, nil
	}
	c, err := listenerTLS(t)
	if err != nil {
		return nil, err
	}
	if c.ClientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	c.NextProtos = []string{"h2"}
	return tls.NewListener(ln, c), nil
}

// quotaLedgers are the quota service's ledgers: on the Redis store if there is one (every
// instance on it serves one fleet of Envoys), else in memory (this instance's Envoys alone). A
// rule's buckets are a group: a bucket seen for the first time is not in learning mode, but every
// bucket is after a flush of the Redis or a restart on the memory store (rlqs.SplitName).
func quotaLedgers(rs *redisstore.Store) ledger.Ledgers {
	if rs != nil {
		return func(name string, opts ledger.Options) (ledger.Ledger, error) {
			rule, _ := rlqs.SplitName(name)
			return rs.GroupLedger(rule, name, opts)
		}
	}
	group := &ledger.MemoryGroup{} // the process: a restart forgets every lease
	return func(name string, opts ledger.Options) (ledger.Ledger, error) {
		return ledger.NewMemory(name, opts, ledger.MemoryOptions{Group: group})
	}
}
