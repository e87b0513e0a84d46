package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
)

// rlsServer is Envoy's rate limit service as sluice serve runs it: the service (on the gateway's
// decision layer, store and metrics), its gRPC server and the gRPC health service.
type rlsServer struct {
	svc    *rls.Service
	grpc   *grpc.Server
	health *health.Server
}

// startRLS makes the rate limit service of cfg.RLS (nil if cfg has none) and has every reload of
// srv read its files again: a reload whose files are invalid fails whole, and the running
// configuration stays. Whether the service runs, and where it listens, changes at a restart.
func startRLS(cfg *config.Config, srv *gateway.Server, log *slog.Logger) (*rlsServer, error) {
	if cfg.RLS == nil {
		srv.OnReload(func(c *config.Config) (func(), error) {
			if c.RLS != nil {
				log.Warn("rls takes effect at the next restart: the rate limit service is not running", "file", c.File)
			}
			return nil, nil
		})
		return nil, nil
	}
	conf, err := envoyconf.Load(cfg.RLS.EnvoyConfig...)
	if err != nil {
		return nil, configError{err}
	}
	svc := rls.New(conf, srv.Decide)
	svc.SetLegacyHeaders(cfg.Limits.LegacyHeaders)
	gs, hs := svc.Server()
	running := *cfg.RLS
	srv.OnReload(func(c *config.Config) (func(), error) {
		if c.RLS == nil {
			log.Warn("rls was removed; the rate limit service runs until the next restart, on its files as they are now", "file", c.File)
			c.RLS = &running
		} else if c.RLS.Listen != running.Listen {
			log.Warn("rls.listen takes effect at the next restart; the running one stays", "file", c.File, "listen", running.Listen)
			c.RLS.Listen = running.Listen
		}
		conf, err := envoyconf.Load(c.RLS.EnvoyConfig...)
		if err != nil {
			return nil, err
		}
		files := slices.Clone(c.RLS.EnvoyConfig)
		return func() {
			svc.Swap(conf)
			svc.SetLegacyHeaders(c.Limits.LegacyHeaders)
			log.Info("Envoy rate limit service configuration reloaded", "envoy_config", fmt.Sprint(files))
		}, nil
	})
	return &rlsServer{svc: svc, grpc: gs, health: hs}, nil
}

// stop says NOT_SERVING on the health service, lets the calls in flight finish until ctx is done,
// then cuts them.
func (r *rlsServer) stop(ctx context.Context) {
	r.health.Shutdown()
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
