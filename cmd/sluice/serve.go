package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/web"
)

// configError is a configuration's errors, one per line, each with its line number: printed as
// they are, not joined into one line.
type configError struct{ err error }

func (c configError) Error() string { return c.err.Error() }
func (c configError) Unwrap() error { return c.err }

func newServeCommand() *cobra.Command {
	var path string
	var watch time.Duration
	cmd := &cobra.Command{
		Use:   "serve [--config FILE] [--listen ADDR] [--admin-listen ADDR]",
		Short: "run the gateway: a rate-limiting reverse proxy, an admin listener, and Envoy's rate limit service",
		Long: `Run sluice as a reverse proxy in front of an API: each request's client is identified, its
policies are decided on the store, and it is forwarded, held (leaky bucket) or answered 429 with
Retry-After, the IETF RateLimit fields and a problem body. The admin listener serves /metrics,
/healthz, /readyz, POST /v1/check (the decision API), /v1/forward-auth (the auth sub-requests of
nginx, Caddy and Traefik: docs/forward-auth.md), GET /v1/stats and the operator page that shows
it (/operator/: who is being limited now, and each client's LLM tokens and dollars per model), and
the browser simulation (/). With an rls section it
is also Envoy's rate limit service (envoy.service.ratelimit.v3 over gRPC), its rules
envoyproxy/ratelimit's configuration files or an xDS management server's (rls.xds, as Envoy
Gateway serves them; docs/envoy.md); listen: "" runs no proxy.

Without --config (or SLUICE_CONFIG, the file's path) it runs a demo: the memory store, a
built-in demo backend, an anonymous token bucket per address, a partner's API key and a
leaky-bucket queue (docs/config.md, "The demo"); it prints what to try: "sluice demo", whose
bursts show 429s and held requests on any machine, and curl commands to read the fields.

--listen and --admin-listen, else SLUICE_LISTEN and SLUICE_ADMIN_LISTEN, put their address
over the file's listen and admin_listen, at the start and at every reload; --admin-listen ""
turns the admin listener off (an empty variable counts as not set).

The configuration is reloaded on SIGHUP and when the file changes; an invalid one is logged
with its lines and the running one stays, the Envoy files included (listen, admin_listen, tls
and rls.listen change at a restart).
SIGTERM or SIGINT shut down gracefully: with server.shutdown_delay, sluice first serves on that
long with /readyz answering 503 (a second signal ends the wait); then requests in flight may
finish for server.drain_timeout (default 30s), and are cut; settlements the store has not
confirmed yet get as long again to land. A request body must keep coming: server.body_timeout and
server.body_min_rate bound a slow one. /readyz is 200 when decisions go to the store. A bad
configuration at start exits with code 2. See docs/config.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := readOverrides(cmd)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), configPath(cmd, path), watch, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "the YAML configuration `FILE` (none: $"+envConfig+", else the demo)")
	cmd.Flags().String("listen", "", "the proxy's `ADDR` (host:port), over the file's listen; \"\": no proxy (default $"+envListen+", else the file's)")
	cmd.Flags().String("admin-listen", "", "the admin listener's `ADDR` (host:port), over the file's admin_listen; \"\": none (default $"+envAdminListen+", else the file's)")
	cmd.Flags().DurationVar(&watch, "watch", time.Second, "how often to check the configuration file for changes (0: only on SIGHUP)")
	return cmd
}

func serve(ctx context.Context, path string, watch time.Duration, o overrides, stdout, stderr io.Writer) error {
	// Take the signals before anything listens: a SIGHUP's default action would end the process.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(signals)
	var cfg *config.Config
	var demo *http.Server
	if path == "" {
		var err error
		if cfg, demo, err = startDemo(); err != nil {
			return failure{err}
		}
		defer demo.Close()
	} else {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return configError{err}
		}
	}
	if err := o.apply(cfg); err != nil {
		if demo != nil {
			return err
		}
		return configError{err}
	}
	// The composition root: the log, the store the configuration describes, the gateway on it,
	// and the pages on the admin listener.
	level := new(slog.LevelVar)
	log := newLogger(cfg.Log, level, stderr)
	stopTracing, err := startTracing(cfg.Tracing)
	if err != nil {
		return failure{err}
	}
	defer func() {
		// The spans of the last requests are sent before the process exits.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("tracing: the last spans were not sent", "error", err.Error())
		}
	}()
	var running atomic.Pointer[gateway.Server] // whose configuration says the local budgets
	st, reg, err := openStoreRegional(cfg.Store, log, runningBudgets(cfg, &running))
	if err != nil {
		return failure{err}
	}
	if err := startRegion(cfg, log, &st, reg); err != nil {
		st.Close()
		return failure{err}
	}
	srv, err := gateway.NewServer(cfg, path, st, log)
	if err != nil {
		return failure{err}
	}
	running.Store(srv)
	defer srv.Close()
	srv.Adjust(o.apply)
	srv.SetReplayer(sim.Replay) // the what-ifs of GET /v1/clients/{name}/needs run on the simulator
	clientsCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	closeClients, err := startClients(clientsCtx, cfg, st, srv, log)
	if err != nil {
		return err
	}
	defer closeClients()
	srv.Mount("GET /", web.Handler()) // the browser simulation, and what no other pattern matches

	svc, err := startRLS(cfg, srv, quotaLedgers(reg.store), log)
	if err != nil {
		return err
	}

	// Every listener is opened before any serves, so that a port in use fails the start whole.
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	listen := func(addr, what string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return nil, failure{fmt.Errorf("listen %s (%s): %w", addr, what, err)}
		}
		lns = append(lns, ln)
		return ln, nil
	}
	var proxyLn, adminLn, rlsLn net.Listener
	var tlsConfig *tls.Config
	if cfg.Listen != "" {
		if proxyLn, err = listen(cfg.Listen, "proxy"); err != nil {
			return err
		}
		if cfg.TLS != nil {
			if tlsConfig, err = listenerTLS(cfg.TLS); err != nil {
				closeAll()
				return configError{fmt.Errorf("%s: tls: %w", cfg.File, err)}
			}
		}
	}
	var adminTLS *tls.Config
	if cfg.AdminListen != "" {
		if adminLn, err = listen(cfg.AdminListen, "admin"); err != nil {
			return err
		}
		if cfg.Admin.TLS != nil {
			if adminTLS, err = listenerTLS(cfg.Admin.TLS); err != nil {
				closeAll()
				return configError{fmt.Errorf("%s: admin.tls: %w", cfg.File, err)}
			}
		}
	}
	if svc != nil {
		if rlsLn, err = listen(cfg.RLS.Listen, "rls"); err != nil {
			return err
		}
		if rlsLn, err = rlsTLS(rlsLn, cfg.RLS.TLS); err != nil {
			closeAll()
			return configError{fmt.Errorf("%s: rls.tls: %w", cfg.File, err)}
		}
	}
	var metricsLn net.Listener
	if cfg.Admin.MetricsListen != "" {
		if metricsLn, err = listen(cfg.Admin.MetricsListen, "metrics"); err != nil {
			return err
		}
	}
	if len(lns) == 0 {
		return configError{fmt.Errorf("%s: nothing to serve: listen, admin_listen and rls are all off", cfg.File)}
	}

	errs := make(chan error, 4)
	var proxy *gateway.Proxy
	if proxyLn != nil {
		proxy = srv.FastServer()
		go func() {
			if tlsConfig != nil {
				errs <- proxy.ServeTLS(proxyLn, tlsConfig)
			} else {
				errs <- proxy.Serve(proxyLn)
			}
		}()
	}
	var admin *http.Server
	if adminLn != nil {
		admin = srv.AdminServer()
		if adminTLS != nil {
			admin.TLSConfig = adminTLS
			go func() { errs <- admin.ServeTLS(adminLn, "", "") }()
		} else {
			go func() { errs <- admin.Serve(adminLn) }()
		}
		log.Info("admin listening", "addr", adminLn.Addr().String(), "tls", adminTLS != nil, "client_certificates", cfg.Admin.TLS != nil && cfg.Admin.TLS.ClientCAFile != "")
	}
	var metrics *http.Server
	if metricsLn != nil {
		metrics = srv.MetricsServer()
		go func() { errs <- metrics.Serve(metricsLn) }()
		log.Info("metrics listening", "addr", metricsLn.Addr().String())
	}
	if rlsLn != nil {
		go func() { errs <- svc.grpc.Serve(rlsLn) }()
		log.Info("Envoy rate limit service listening (gRPC)", "addr", rlsLn.Addr().String(), "tls", cfg.RLS.TLS != nil, "envoy_config", cfg.RLS.EnvoyConfig, "quota", cfg.RLS.Quota != nil)
	}
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	if proxyLn != nil {
		log.Info("sluice serving", "addr", proxyLn.Addr().String(), "upstream", cfg.Upstream.String(), "config", cfg.String())
	} else {
		log.Info("sluice serving, with no proxy listener (listen: \"\")", "config", cfg.String())
	}
	if demo != nil && proxyLn != nil {
		printDemo(stdout, scheme+"://"+proxyLn.Addr().String(), cfg.AdminListen)
	}

	var tick <-chan time.Time
	var stamp fileStamp
	if path != "" && watch > 0 {
		t := time.NewTicker(watch)
		defer t.Stop()
		tick, stamp = t.C, statFile(path)
	}
	for {
		select {
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				_ = srv.Reload()
				level.Set(srv.Config().Log.Level) // the running configuration's: the new one if it took
				continue
			}
			if delay := srv.Config().Server.ShutdownDelay; delay > 0 {
				// Serve on, unready, while load balancers take this instance out; a second
				// signal ends the wait.
				srv.Stopping()
				log.Info("shutting down after server.shutdown_delay; /readyz answers 503, requests are still served", "signal", sig.String(), "shutdown_delay", delay.String())
				wait := time.NewTimer(delay)
			delaying:
				for {
					select {
					case <-wait.C:
						break delaying
					case s := <-signals:
						if s == syscall.SIGHUP {
							_ = srv.Reload()
							continue
						}
						wait.Stop()
						sig = s
						break delaying
					}
				}
			}
			drain(log, sig, srv.Config().Server.DrainTimeout, proxy, svc, admin, metrics)
			return nil
		case <-tick:
			if now := statFile(path); now != stamp {
				stamp = now
				_ = srv.Reload()
				level.Set(srv.Config().Log.Level) // the running configuration's: the new one if it took
			}
		case err := <-errs:
			if err == nil || errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return failure{err}
		case <-ctx.Done():
			return nil
		}
	}
}

// drain shuts the listeners down at sig: requests in flight (held ones too) may finish within
// timeout (server.drain_timeout), idle connections close at once, and those still running then
// are cut, the process exiting. proxy, svc and the servers may be nil.
func drain(log *slog.Logger, sig os.Signal, timeout time.Duration, proxy *gateway.Proxy, svc *rlsServer, servers ...*http.Server) {
	log.Info("shutting down; requests in flight may finish", "signal", sig.String(), "drain_timeout", timeout.String())
	shutdown, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, hs := range servers {
		if hs != nil {
			wg.Go(func() { _ = hs.Shutdown(shutdown) })
		}
	}
	if svc != nil {
		wg.Go(func() { svc.stop(shutdown) })
	}
	var err error
	if proxy != nil {
		err = proxy.ShutdownWithContext(shutdown)
	}
	wg.Wait()
	if err != nil || shutdown.Err() != nil {
		log.Warn("drain_timeout passed with requests in flight; they are cut", "drain_timeout", timeout.String())
	}
}

// fileStamp tells a changed file: its size and modification time.
type fileStamp struct {
	size int64
	mod  time.Time
}

func statFile(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{size: -1}
	}
	return fileStamp{fi.Size(), fi.ModTime()}
}

// startDemo starts the demo backend on a free loopback port and returns the demo configuration
// in front of it.
func startDemo() (*config.Config, *http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"backend": "sluice demo", "method": r.Method, "path": r.URL.Path,
			"x_forwarded_for": r.Header.Get("X-Forwarded-For"), "time": time.Now().UTC().Format(time.RFC3339Nano)})
	}), ReadHeaderTimeout: 10 * time.Second}
	go backend.Serve(ln) //nolint:errcheck // closed by the caller
	cfg, err := config.Demo("http://" + ln.Addr().String())
	if err != nil {
		backend.Close()
		return nil, nil, err
	}
	return cfg, backend, nil
}

// printDemo says what to try on the demo: the demo command first, whose bursts show a 429 and
// held requests whatever the machine's speed (a loop of curls can be slow enough for the bucket to
// refill), then single requests to read the fields, which it explains.
func printDemo(w io.Writer, proxy, admin string) {
	demo := self() + " demo"
	if proxy != "http://"+config.DefaultListen {
		demo += " --proxy " + proxy
	}
	switch admin {
	case config.DefaultAdminListen:
	case "":
		demo += " --admin ''"
	default:
		demo += " --admin http://" + admin
	}
	fmt.Fprintf(w, `sluice demo: a rate-limiting proxy on %[1]s in front of a built-in demo backend.

See 429s and held requests (in another terminal): 25 requests at once, then 6 to a queue:
  %[4]s

Or one request at a time, to read the fields:
  curl -i %[1]s/hello                                        # anonymous, per IP: 10 per 10s, saving up to 20
  curl -i -H 'X-API-Key: %[2]s' %[1]s/hello           # client "demo-partner": 50 per 10s
  curl -i -X POST -H 'X-API-Key: %[2]s' %[1]s/reports  # a report costs 5
  curl -i %[1]s/queue                                        # a leaky bucket, 2 a second: held behind others, not refused
  curl -s -X POST http://%[3]s/v1/check -d '{"client":"demo-partner","cost":1}'
  curl -s http://%[3]s/metrics | grep -E '^sluice_(decisions_total|hold_seconds_(count|sum))'

RateLimit-Policy: "anonymous";q=10;w=10 is the policy: q requests per w seconds.
RateLimit: "anonymous";r=19;t=1 is where you stand: r requests left now, all back in t seconds
(on a 429, t is when to retry, as Retry-After says). r can be above q: a token bucket saves
unused requests up to its burst, 20 here.
Open http://%[3]s/operator/ to see who is being limited, http://%[3]s/ for the simulation.
Stop with Ctrl-C.
`, proxy, config.DemoAPIKey, admin, demo)
}

// self is how to run this sluice again from a shell: "go run ./cmd/sluice" when `go run` built it
// (into a go-build temporary directory), else the name it was started by.
func self() string {
	if strings.Contains(os.Args[0], "go-build") {
		return "go run ./cmd/sluice"
	}
	return os.Args[0]
}

// listenerTLS is the TLS configuration of a listener's certificate (config checked the files at
// load; they are read again here, as the listener starts). With t.ClientCAFile, the handshake asks
// for a client certificate and verifies one that is given against those CAs; the admin listener
// then refuses a request without one (gateway: the probes need none, as kubelet has none).
func listenerTLS(t *config.TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client_ca_file %q holds no PEM certificate", t.ClientCAFile)
		}
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c, nil
}
