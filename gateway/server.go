package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/clients"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/gateway/operator"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/rlqs"
)

// Server runs a configuration and swaps in a new one on Reload without dropping requests: each
// request is served whole by the Gateway it started on.
type Server struct {
	current  atomic.Pointer[Gateway]
	cfg      atomic.Pointer[config.Config]
	path     string       // the configuration file; "" for the demo
	store    sluice.Store // guarded
	ping     func(context.Context) error
	closer   func()
	fleet    func() FleetStats // nil: no instance registry
	metrics  *Metrics
	registry *prometheus.Registry
	log      *slog.Logger
	mounts   []mount
	prepare  func(*config.Config) (func(), error)
	global   decision.Global // nil: global policies decide on their configured limit
	regions  func() RegionStats
	adjust   func(*config.Config) error

	quota     atomic.Pointer[Quota] // the Rate Limit Quota Service, if it runs (SetQuota; rlqs.go)
	quotaOnce sync.Once             // registers its metrics

	listen, adminListen atomic.Pointer[string] // the addresses listened on (Proxy.Serve, AdminServer)
	stopping            atomic.Bool            // shutting down: /readyz answers 503 (Stopping)

	// settlements makes every Gateway's settlements and usage charges land (Envoy's rate limit
	// service's too: it decides through Decide), drained by Close.
	settlements *sluice.Settlements

	// base is the file's configuration (adjusted) that cfg merges the clients API's records
	// into (clients.go); clients is their manager, nil without one. swap orders the swaps of
	// reloads and of the records' changes.
	base    atomic.Pointer[config.Config]
	clients *clients.Manager
	swap    sync.Mutex

	replay Replayer // the what-if's (needs_whatif.go); nil: none

	// history is the last hour of this instance's figures, fleetHistory the fleet's (nil: the
	// memory store's, whose fleet is this instance); folded every historyEvery until Close
	// (history.go).
	history                  history
	fleetHistory             *FleetHistory
	historyStop, historyDone chan struct{}
	closeOnce                sync.Once
}

// Stopping makes /readyz answer 503 from now on: the process is shutting down (its
// server.shutdown_delay), and a load balancer should stop sending it requests, which it still
// serves.
func (s *Server) Stopping() { s.stopping.Store(true) }

// Store is the store a Server decides on, opened by its caller (cmd/sluice opens the configured
// one, memory or Redis, and guards it with the configured failure mode: sluice.Guard).
type Store struct {
	sluice.Store                             // guarded
	Ping         func(context.Context) error // whether it answers (readiness, /v1/stats); nil: always
	Close        func()                      // nil: nothing to close
	// Fleet, if set, is the instance registry the store runs (a Redis store), for /v1/stats,
	// the operator page and the metrics.
	Fleet func() FleetStats
	// Shares, if set, counts this instance's approvals for the registry's heartbeats (which
	// read it with Shares.Counts); the Server records every decision in it.
	Shares *Shares
	// Clients, if set, is where the store keeps the clients API's records (a Redis store's
	// registry); nil: the caller keeps them (clients.MemoryBackend).
	Clients clients.Backend
	// Global, if set, gives the global: true policies this region's allotments (package
	// region); if it has a Configure(*config.Config) error method, every configuration the
	// Server runs is given to it first.
	Global decision.Global
	// Regions, if set, is this region's global policies (GET /v1/stats "regions", the
	// sluice_region_* metrics).
	Regions func() RegionStats
	// FleetHistory, if set, keeps the fleet's last hour in the store (a Redis store), for GET
	// /v1/history and the operator page's chart; nil: the fleet is this instance.
	FleetHistory *FleetHistory
}

// RegionStats is this region's side of the global: true policies (GET /v1/stats "regions").
type RegionStats struct {
	Region   string                 `json:"region"`
	Policies []decision.GlobalStats `json:"policies"` // by name
}

// NewServer returns a Server running cfg on st; path is the file Reload reads. The Server
// closes st on Close, and on an error here.
func NewServer(cfg *config.Config, path string, st Store, log *slog.Logger) (*Server, error) {
	s := &Server{path: path, log: log, registry: prometheus.NewRegistry(), ping: st.Ping, closer: st.Close, fleet: st.Fleet, replay: testReplayer, global: st.Global, regions: st.Regions,
		fleetHistory: st.FleetHistory}
	if s.ping == nil {
		s.ping = func(context.Context) error { return nil }
	}
	if s.closer == nil {
		s.closer = func() {}
	}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = NewMetrics(s.registry)
	s.metrics.diag.shares = st.Shares
	s.metrics.malformed = newRateLog(log, malformedPerSecond, "malformed request", "peer")
	s.metrics.upstreamLog = newRateLog(log, upstreamPerSecond, "upstream failed", "upstream")
	s.store = st.Store
	s.metrics.countStoreErrors(s.registry, st.Store)
	if a, ok := st.Store.(sluice.Available); ok {
		s.store = &watchedStore{Store: st.Store, avail: a, log: log, mode: cfg.Store.OnError.String()}
	}
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_store_breaker_open",
		Help: "1 while the store's breaker is open (it failed; the failure mode decides until a probe finds it back), else 0."},
		func() float64 {
			if a, ok := s.store.(sluice.Available); ok && !a.Available() {
				return 1
			}
			return 0
		}), prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_store_reachable",
		Help: "1 if the store answered a ping at this scrape (within a second), else 0."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if s.ping(ctx) != nil {
				return 0
			}
			return 1
		}))
	if s.fleet != nil {
		s.registerFleet(s.fleet)
	}
	if s.regions != nil {
		s.registry.MustRegister(regionCollector{s.regions})
	}
	s.registerShed()
	s.settlements = sluice.NewSettlements(s.store, sluice.SettlementOptions{RetryFor: cfg.Store.SettleRetryFor})
	s.registerSettlements()
	g, err := s.gateway(cfg, nil)
	if err != nil {
		s.closer()
		return nil, err
	}
	s.base.Store(cfg)
	s.run(cfg, g)
	s.history.start = slotOf(s.metrics.now())
	s.historyStop, s.historyDone = make(chan struct{}), make(chan struct{})
	go s.runHistory(s.historyStop, s.historyDone)
	return s, nil
}

// gateway makes the Gateway for cfg with what the Server keeps across configurations: its store,
// metrics and settlements, and up (the previous Gateway's connections; nil: new ones).
func (s *Server) gateway(cfg *config.Config, up *Upstream) (*Gateway, error) {
	g, err := New(cfg, s.store, s.metrics, up)
	if err != nil {
		return nil, err
	}
	g.decider.Settlements = s.settlements
	if s.global != nil {
		if c, ok := s.global.(interface{ Configure(*config.Config) error }); ok {
			if err := c.Configure(cfg); err != nil {
				return nil, err
			}
		}
		g.decider.Global = s.global
	}
	g.access = newAccessLog(cfg.Log.Access, s.log)
	return g, nil
}

// run makes cfg and its Gateway g the running ones (with what they set of the Server's own: the
// body memory).
func (s *Server) run(cfg *config.Config, g *Gateway) {
	s.metrics.bodies.setLimit(cfg.Server.BodyMemory)
	s.current.Store(g)
	s.cfg.Store(cfg)
}

// Registry is where the Server's metrics are registered: other front ends (cmd/sluice's Envoy
// rate limit service) register theirs on it, to be served on /metrics too.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Store returns the store the Server decides on (guarded, its breaker's changes logged).
func (s *Server) Store() sluice.Store { return s.store }

// Mount serves h on the admin listener under pattern (http.ServeMux's), beside the Server's
// own endpoints: cmd/sluice mounts the browser simulation on "GET /". Call it before Admin.
func (s *Server) Mount(pattern string, h http.Handler) {
	s.mounts = append(s.mounts, mount{pattern, h})
}

type mount struct {
	pattern string
	h       http.Handler
}

// Config returns the configuration running now.
func (s *Server) Config() *config.Config { return s.cfg.Load() }

// ServeHTTP serves a request on the current configuration with the net/http engine.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.current.Load().ServeHTTP(w, r) }

// ServeFast serves a request on the current configuration with the fasthttp engine.
func (s *Server) ServeFast(ctx *fasthttp.RequestCtx) { s.current.Load().ServeFast(ctx) }

// Limits of the proxy listener (the fasthttp engine's) and of the admin listener. The body's
// allowance is the configuration's (server.body_timeout, server.body_min_rate; see bodyConn).
var (
	headerTimeout = 10 * time.Second // to read a request's header; a variable for the tests
	idleTimeout   = 120 * time.Second
	// The admin listener's: a request whole (its body is at most maxCheckBody), and an answer
	// (the largest is the simulation's WebAssembly, a few MB).
	adminReadTimeout  = 30 * time.Second
	adminWriteTimeout = 60 * time.Second
)

const (
	maxHeaderBytes = 32 << 10 // a request's header, with its line; larger ones get 431
	maxBufferBody  = 64 << 10 // larger bodies are streamed to the upstream, not buffered
	maxCheckBody   = 64 << 10 // the body of POST /v1/check; larger ones get 413
)

// Proxy is the proxy listener's server: the fasthttp engine serving a Server. Serve and ServeTLS
// (not the embedded server's other Listen and Serve methods) put the body allowance on every
// connection, and note the address for GET /v1/stats.
type Proxy struct {
	*fasthttp.Server
	s *Server
}

// Serve serves plain HTTP on ln until Shutdown.
func (p *Proxy) Serve(ln net.Listener) error {
	p.s.listen.Store(ptr(ln.Addr().String()))
	return p.Server.Serve(bodyListener{ln, p.s})
}

// ServeTLS serves HTTPS on ln (a TCP listener) with tc until Shutdown. The body allowance is
// on the TCP connection under the TLS one.
func (p *Proxy) ServeTLS(ln net.Listener, tc *tls.Config) error {
	p.s.listen.Store(ptr(ln.Addr().String()))
	return p.Server.Serve(tls.NewListener(bodyListener{ln, p.s}, tc))
}

func ptr[T any](v T) *T { return &v }

// FastServer returns the proxy listener's server: the fasthttp engine serving s, with the
// timeouts and limits above, bodies streamed both ways, and errors logged to log.
func (s *Server) FastServer() *Proxy {
	headerTimeout := headerTimeout
	return &Proxy{s: s, Server: &fasthttp.Server{
		Handler: s.ServeFast,
		// The header must come within headerTimeout; a body gets its allowance (bodyMarker).
		ReadTimeout: headerTimeout,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if h.ContentLength() != 0 {
				return fasthttp.RequestConfig{ReadTimeout: bodyMarker}
			}
			return fasthttp.RequestConfig{}
		},
		IdleTimeout:                  idleTimeout,
		ReadBufferSize:               maxHeaderBytes,
		MaxRequestBodySize:           maxBufferBody,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true, // fasthttp's errors do not quote the request (they are not logged either)
		Logger:                       fastLogger{s.log},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			status, detail := fasthttp.StatusBadRequest, "the request could not be read"
			var big *fasthttp.ErrSmallBuffer
			bc := bodyConnOf(ctx.Conn())
			switch {
			case errors.As(err, &big):
				status, detail = fasthttp.StatusRequestHeaderFieldsTooLarge, "the request's header is over 32 KiB"
			case isTimeout(err) && bc != nil && bc.body:
				cfg := s.cfg.Load().Server
				status, detail = fasthttp.StatusRequestTimeout, fmt.Sprintf("the request's body stopped coming, or came slower than %d bytes a second for %v (server.body_timeout, server.body_min_rate)",
					cfg.BodyMinRate, cfg.BodyTimeout)
			case isTimeout(err):
				status, detail = fasthttp.StatusRequestTimeout, fmt.Sprintf("the request's header did not arrive within %v", headerTimeout)
			default:
				detail += ": " + describeReadError(err)
			}
			s.metrics.malformed.warn(ctx.RemoteAddr().String(), detail)
			// Not err's text: fasthttp's can quote the request, and with it a credential.
			writeProblem(ctx, answer.Problem{Type: answer.TypeBlank, Title: fasthttp.StatusMessage(status), Status: status, Detail: detail})
			ctx.SetConnectionClose()
		},
	}}
}

// fastLogger sends fasthttp's own messages to the log, without their arguments: those can quote
// a request, and with it a credential. Its line for each connection that ended in an error is
// left to debugging: the errors of reading a request are logged (and rate limited) by the
// ErrorHandler, and the others are those of writing to a client that left.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	if strings.HasPrefix(format, "error when serving connection") {
		if len(args) == 3 {
			err, _ := args[2].(error)
			l.log.Debug("http server: connection ended", "peer", fmt.Sprint(args[1]), "problem", describeReadError(err))
		}
		return
	}
	l.log.Warn("http server", "message", format)
}

// ErrStoreChanged is returned by Reload for a file whose store section differs: the store's
// connections cannot be swapped under running requests; restart to change it.
var ErrStoreChanged = errors.New("the store section changed; restart sluice to change the store")

// ErrRegionChanged is Reload's error for a file whose region section differs from the running
// one's: the refresher runs on the global Redis it was started with (a global policy's own
// changes reload).
var ErrRegionChanged = errors.New("the region section changed; restart sluice to change the region")

// sameRegion: a and b are the same region section, wherever in the file.
func sameRegion(a, b *config.Region) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.Line, y.Line = 0, 0
	return reflect.DeepEqual(x, y)
}

// Reload reads the configuration file again and, if it is valid, swaps it in; otherwise the
// running configuration stays and the error (with its lines) is returned, logged and counted.
func (s *Server) Reload() error {
	err := s.reload()
	s.metrics.lastReload.SetToCurrentTime()
	if err != nil {
		s.metrics.lastReloadOK.Set(0)
		s.metrics.reloads.WithLabelValues("failed").Inc()
		s.log.Error("configuration not reloaded; the previous one keeps running", "file", s.path, "error", err.Error())
		return err
	}
	s.metrics.lastReloadOK.Set(1)
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.log.Info("configuration reloaded", "file", s.path, "config", s.cfg.Load().String())
	return nil
}

func (s *Server) reload() error {
	s.swap.Lock()
	defer s.swap.Unlock()
	if s.path == "" {
		return errors.New("the demo has no configuration file to reload")
	}
	cfg, err := config.Load(s.path)
	if err != nil {
		return err
	}
	if s.adjust != nil {
		if err := s.adjust(cfg); err != nil {
			return err
		}
	}
	old := s.cfg.Load()
	if !reflect.DeepEqual(cfg.Store, old.Store) {
		return ErrStoreChanged
	}
	if !sameRegion(cfg.Region, old.Region) {
		return ErrRegionChanged
	}
	if cfg.Admin.MetricsListen != old.Admin.MetricsListen {
		s.log.Warn("admin.metrics_listen takes effect at the next restart; the running one stays", "file", s.path, "metrics_listen", old.Admin.MetricsListen)
		cfg.Admin.MetricsListen = old.Admin.MetricsListen
	}
	if !reflect.DeepEqual(cfg.Admin.TLS, old.Admin.TLS) {
		// The running listener's handshake says who gets in: its client CAs are what authorize.
		s.log.Warn("admin.tls takes effect at the next restart; the running one stays", "file", s.path)
		cfg.Admin.TLS = old.Admin.TLS
	}
	if cfg.Listen != old.Listen || cfg.AdminListen != old.AdminListen || !reflect.DeepEqual(cfg.TLS, old.TLS) {
		s.log.Warn("listen, admin_listen and tls take effect at the next restart; the running ones stay",
			"file", s.path, "listen", old.Listen, "admin_listen", old.AdminListen)
		// The running configuration says what runs: the listeners are the old ones until then.
		cfg.Listen, cfg.AdminListen, cfg.TLS = old.Listen, old.AdminListen, old.TLS
	}
	if cfg.Listen != "" && cfg.Upstream == nil {
		return fmt.Errorf("%s: upstream is required while the proxy listener runs (it stops with listen: \"\" at a restart)", cfg.File)
	}
	base := cfg
	if cfg, err = s.merged(cfg); err != nil {
		return err
	}
	g, err := s.gateway(cfg, s.current.Load().Upstream())
	if err != nil {
		return err
	}
	var commit func()
	if s.prepare != nil {
		if commit, err = s.prepare(cfg); err != nil {
			return err
		}
	}
	s.base.Store(base)
	s.run(cfg, g)
	if commit != nil {
		commit()
	}
	return nil
}

// OnReload has every Reload call prepare with the new configuration once it is valid: prepare
// reads what else the configuration names (the Envoy rate limit service's files, say) and
// returns the function that swaps it in, called with the configuration's own swap; its error
// fails the whole reload, and the running configuration stays, all of it. Call it before
// serving.
func (s *Server) OnReload(prepare func(cfg *config.Config) (commit func(), err error)) {
	s.prepare = prepare
}

// Adjust has every Reload change the configuration it read by adjust before anything looks at
// it: cmd/sluice puts the listen addresses of its command line over the file's, as it did at the
// start. Its error fails the reload. Call it before serving.
func (s *Server) Adjust(adjust func(cfg *config.Config) error) {
	s.adjust = adjust
}

// Decide decides req on the configuration running now (its metrics and operator page count it):
// the decision layer, for front ends outside this package (Envoy's rate limit service).
func (s *Server) Decide(ctx context.Context, req *decision.Request) decision.Verdict {
	return s.current.Load().Decide(ctx, req)
}

// Close lands the settlements still pending, for up to server.drain_timeout (at least a second;
// those left then are counted lost), and closes the store.
func (s *Server) Close() {
	s.closeOnce.Do(s.close)
}

func (s *Server) close() {
	close(s.historyStop)
	<-s.historyDone
	bound := max(s.Config().Server.DrainTimeout, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	before := s.settlements.Stats()
	if before.Pending > 0 {
		s.log.Info("landing the settlements still pending before closing the store", "pending", before.Pending, "bound", bound.String())
	}
	s.settlements.Close(ctx)
	if after := s.settlements.Stats(); after.LostShutdown > before.LostShutdown {
		s.log.Warn("settlements lost at shutdown: the store did not take them in time; their estimates stand",
			"lost", after.LostShutdown-before.LostShutdown, "bound", bound.String())
	}
	s.closer()
}

// AdminServer returns the admin listener's server: Admin's handler, with a bound on everything a
// client can make it wait for (a header, a request whole, an answer, an idle connection, a
// header's size; /v1/check bounds its body), and the address it serves on noted for /v1/stats.
func (s *Server) AdminServer() *http.Server {
	return &http.Server{
		Handler:           s.Admin(),
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext: func(ln net.Listener) context.Context {
			s.adminListen.Store(ptr(ln.Addr().String()))
			return context.Background()
		},
	}
}

// Admin returns the admin listener's handler: /metrics (Prometheus), /healthz (the process is
// up), /readyz (decisions go to the store), POST /v1/check (the decision API), /v1/forward-auth
// (proxies' auth sub-requests), GET /v1/stats, GET /v1/history and GET /v1/clients/{name}/needs
// and the operator page that shows them (/operator/), and the browser simulation (/).
func (s *Server) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.stopping.Load() {
			answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusServiceUnavailable),
				Status: http.StatusServiceUnavailable, Detail: "shutting down: requests are still served until server.shutdown_delay has passed"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := s.ready(ctx); err != nil {
			answer.WriteProblem(w, answer.StoreUnavailable("", time.Second))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("POST /v1/check", s.check)
	mux.HandleFunc("GET /v1/stats", s.stats)
	mux.HandleFunc("GET /v1/history", s.historyHandler)           // history.go
	mux.HandleFunc("GET /v1/clients/{name}/needs", s.clientNeeds) // needs_whatif.go
	mux.Handle("GET /operator/", http.StripPrefix("/operator/", operator.Handler()))
	for _, m := range s.mounts {
		mux.Handle(m.pattern, m.h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == forwardAuthPath { // any method; a pattern for every method would clash with the mounts' "GET /"
			s.forwardAuth(w, r) // believed only from trusted_proxies: no token
			return
		}
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			// The probes answer anyone: a load balancer or kubelet has no token or certificate.
			if why := s.unauthorized(r); why != "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
				answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusUnauthorized),
					Status: http.StatusUnauthorized, Detail: why})
				return
			}
		}
		if r.URL.Path == "/v1/check" && r.Method != http.MethodPost {
			// The mux would give GET to the simulation and answer the others in plain text.
			w.Header().Set("Allow", http.MethodPost)
			answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusMethodNotAllowed),
				Status: http.StatusMethodNotAllowed, Detail: "the decision API takes POST /v1/check with a JSON body, not " + r.Method})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// unauthorized says why r may not use the admin listener, or "" if it may: with admin.tls's
// client_ca_file, r must have come with a client certificate that CA signed (the handshake
// verified it); with admin.token_env, r must carry the token as a bearer token (compared in
// constant time); with both, both.
func (s *Server) unauthorized(r *http.Request) string {
	a := s.cfg.Load().Admin
	if a.TLS != nil && a.TLS.ClientCAFile != "" && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return "the admin listener wants a client certificate signed by a CA of admin.tls.client_ca_file"
	}
	if !a.HasToken() {
		return ""
	}
	got, ok := identity.BearerToken(r.Header.Get("Authorization"))
	if !ok || a.AdminTokenFor(got) == "" {
		return "the admin listener wants Authorization: Bearer TOKEN (admin.token_env or admin.tokens)"
	}
	return ""
}

// MetricsServer returns the server of admin.metrics_listen: /metrics (and /healthz) only, with
// no token, for scrapers that should reach nothing else.
func (s *Server) MetricsServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	return &http.Server{Handler: mux, ReadHeaderTimeout: headerTimeout, ReadTimeout: adminReadTimeout,
		WriteTimeout: adminWriteTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes}
}

// readyKey and readyPolicy are what /readyz decides on: a key no client's can be (client names
// have no ':'), and a policy it only peeks at (cost 0).
const readyKey = "sluice:readyz"

var readyPolicy = sluice.Policy{Name: "readyz", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}

// errFallback is /readyz's answer while the failure mode decides.
var errFallback = errors.New("the store's breaker is open: the failure mode decides")

// ready reports whether decisions go to the store: it makes one, through the breaker, like a
// request's. So ready means that a request decided now is decided by the store, not merely that
// the store answers a PING; and a breaker whose cooldown has passed is probed by /readyz itself
// (closed again, or kept open), so that an instance its load balancer stopped sending requests
// to comes back once the store does. The memory store is always ready.
func (s *Server) ready(ctx context.Context) error {
	if _, ok := s.store.(sluice.Available); !ok {
		return s.ping(ctx)
	}
	var out [1]sluice.Decision
	if _, err := s.store.DecideAll(ctx, readyKey, []sluice.Limit{{Policy: readyPolicy, Cost: 0}}, out[:]); err != nil {
		return err
	}
	if out[0].Fallback != sluice.NoFallback {
		return errFallback
	}
	return nil
}

// watchedStore is the guarded store, with its breaker's changes logged once each: when it opens
// (the store stopped answering; the failure mode decides) and when it closes (decisions go to
// the store again). It looks after every decision; that is two atomic loads.
type watchedStore struct {
	sluice.Store
	avail sluice.Available
	log   *slog.Logger
	mode  string      // the failure mode, for the log
	down  atomic.Bool // as last logged
}

func (w *watchedStore) Decide(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	d, err := w.Store.Decide(ctx, key, p, cost)
	w.observe(err)
	return d, err
}

func (w *watchedStore) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	ok, err := w.Store.DecideAll(ctx, key, limits, out)
	w.observe(err)
	return ok, err
}

// Available is the guarded store's.
func (w *watchedStore) Available() bool { return w.avail.Available() }

// observe logs a change of the breaker since the last one logged; of the decisions that see the
// same change at once, one logs it.
func (w *watchedStore) observe(err error) {
	down := !w.avail.Available()
	if down == w.down.Load() || !w.down.CompareAndSwap(!down, down) {
		return
	}
	if down {
		args := []any{"on_error", w.mode}
		if err != nil {
			args = append(args, "error", err.Error())
		}
		w.log.Warn("store unavailable: its breaker opened after repeated failures; the failure mode decides until it answers again", args...)
		return
	}
	w.log.Info("store available again: its breaker closed; decisions go to it")
}

// Stats is the body of GET /v1/stats: what the operator page shows.
type Stats struct {
	Time          time.Time     `json:"time"`
	UptimeSeconds float64       `json:"uptime_s"`
	RateSeconds   int           `json:"rate_s"` // the seconds the per-second rates average over
	Config        string        `json:"config"` // the running configuration, in one line (no secrets)
	Store         StoreStats    `json:"store"`
	Clients       []ClientStats `json:"clients"` // the limited first, then by name
	// The addresses listened on (a port 0 resolved), which a reload does not change; "" for a
	// listener this Server does not serve (see Proxy.Serve, AdminServer).
	Listen      string `json:"listen"`
	AdminListen string `json:"admin_listen"`
	// Fleet is the instance registry, if the store runs one (a Redis store).
	Fleet *FleetStats `json:"fleet,omitempty"`
	// Regions is this region's allotments of the global policies, if it has a region section.
	Regions *RegionStats `json:"regions,omitempty"`
	// LoadShedding is this instance's throttling by load, if configured (load_shedding; shed.go).
	LoadShedding *ShedStats `json:"load_shedding,omitempty"`
	// RLQS is Envoy's Rate Limit Quota Service, if it runs (rls.quota): its Envoys' streams and
	// their buckets, as this instance serves them.
	RLQS *rlqs.Stats `json:"rlqs,omitempty"`
	// Diagnosis is the usual mistakes found in the traffic, each with what to do (diagnosis.go).
	Diagnosis Diagnosis `json:"diagnosis"`
	// Registry is what this instance runs of the clients API's records: how many clients from
	// the API and from the file, the file's the API shadows, those that cannot run and why, and
	// when the records were last read (package clients).
	Registry *clients.Status `json:"registry,omitempty"`
}

// StoreStats is the store's health as the gateway sees it.
type StoreStats struct {
	Type      string `json:"type"`     // memory or redis
	OnError   string `json:"on_error"` // the failure mode: fail-closed, fail-open or local
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"` // why it is not reachable
	// BreakerOpen: decisions do not go to the store now (it failed; the failure mode decides)
	// until a probe finds it back.
	BreakerOpen bool `json:"breaker_open"`
	// Errors is the calls to the store that failed (sluice_store_errors_total: a timeout, a lost
	// connection), whatever the failure mode then answered; Unavailable the requests answered 503
	// because the store could not decide (fail-closed).
	Errors      uint64 `json:"errors"`
	Unavailable uint64 `json:"unavailable"`
	Fallbacks   uint64 `json:"fallbacks"` // decisions the failure mode made instead of the store
	// Settlements: those the store could not confirm when asked, pending until they land, and
	// those given up (lost), by reason (sluice_settlements_pending, sluice_settlements_lost_total).
	Settlements sluice.SettlementStats `json:"settlements"`
}

// stats serves GET /v1/stats.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	// The quota service's ledgers are read (within a second) while the rest is gathered and the
	// store pinged.
	quota := make(chan *rlqs.Stats, 1)
	go func() {
		if qs, ok := s.quotaView(r.Context()); ok {
			quota <- &qs
			return
		}
		quota <- nil
	}()
	cfg := s.cfg.Load()
	st := Stats{Time: now.UTC(), UptimeSeconds: now.Sub(s.metrics.activity.started).Seconds(), Config: cfg.String()}
	if a := s.listen.Load(); a != nil {
		st.Listen = *a
	}
	if a := s.adminListen.Load(); a != nil {
		st.AdminListen = *a
	}
	st.Clients, st.RateSeconds = s.metrics.activity.snapshot(now)
	st.Store = StoreStats{Type: cfg.Store.Type, OnError: cfg.Store.OnError.String(), Reachable: true,
		Errors: s.metrics.storeErrors(), Unavailable: s.metrics.unavailable.Load(), Fallbacks: s.metrics.fallbacks.Load(),
		Settlements: s.settlements.Stats()}
	if a, ok := s.store.(sluice.Available); ok {
		st.Store.BreakerOpen = !a.Available()
	}
	if s.fleet != nil {
		f := s.fleet()
		st.Fleet = &f
	}
	if s.regions != nil {
		rs := s.regions()
		st.Regions = &rs
	}
	st.LoadShedding = s.current.Load().shedStats()
	st.Diagnosis = s.metrics.diag.snapshot(now, cfg, st.Fleet)
	if st.Regions != nil {
		st.Diagnosis.Findings = append(st.Diagnosis.Findings, regionFindings(*st.Regions)...)
	}
	st.Registry = s.ClientsStatus()
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.ping(ctx); err != nil {
		st.Store.Reachable, st.Store.Error = false, err.Error()
	}
	if st.RLQS = <-quota; st.RLQS != nil {
		st.Diagnosis.Findings = append(st.Diagnosis.Findings, rlqsFindings(*st.RLQS, now)...)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(st)
}

// checkRequest is the body of POST /v1/check.
type checkRequest struct {
	Client string `json:"client"`  // a configured client's name
	APIKey string `json:"api_key"` // or its API key (hashed, never stored)
	Key    string `json:"key"`     // or an opaque key to limit (e.g. an address) under the default policy
	Policy string `json:"policy"`  // one configured policy; "" for the client's (or the default) policies
	Cost   *int64 `json:"cost"`    // default 1; 0 peeks
}

// parseCheck reads the body of POST /v1/check: one JSON object of the fields above, of at most
// maxCheckBody bytes, with nothing after it, and a cost ≥ 0. A problem is the answer to send:
// 413 for a body over the bound, 400 for anything else.
func parseCheck(w http.ResponseWriter, r *http.Request) (checkRequest, *answer.Problem) {
	var body checkRequest
	tooLarge := &answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusRequestEntityTooLarge), Status: http.StatusRequestEntityTooLarge,
		Detail: fmt.Sprintf("the body of POST /v1/check is at most %d KiB", maxCheckBody>>10)}
	if r.ContentLength > maxCheckBody {
		return body, tooLarge
	}
	var big *http.MaxBytesError
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		if errors.As(err, &big) {
			return body, tooLarge
		}
		p := answer.BadRequest("the body must be JSON like {\"client\":\"partner-a\",\"policy\":\"standard\",\"cost\":1}: " + err.Error())
		return body, &p
	}
	switch err := dec.Decode(new(json.RawMessage)); {
	case errors.As(err, &big):
		return body, tooLarge
	case err != io.EOF:
		p := answer.BadRequest("the body must be one JSON object, with nothing after it")
		return body, &p
	}
	if body.Cost != nil && *body.Cost < 0 {
		p := answer.InvalidCost(*body.Cost)
		return body, &p
	}
	return body, nil
}

type checkDecision struct {
	Policy       string  `json:"policy"`
	Allowed      bool    `json:"allowed"`
	DryRun       bool    `json:"dry_run,omitempty"`
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMs float64 `json:"retry_after_ms"`
	ResetAfterMs float64 `json:"reset_after_ms"`
	DelayMs      float64 `json:"delay_ms"`
}

// check is the decision API: the same decision the proxy would make, as JSON; 200 if allowed,
// 429 (with Retry-After and the RateLimit fields) if not.
func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	g := s.current.Load()
	body, problem := parseCheck(w, r)
	if problem != nil {
		answer.WriteProblem(w, *problem)
		return
	}
	var client *config.Client
	var who identity.Identity
	switch {
	case body.APIKey != "":
		c, ok := g.cfg.ClientByKeyHash(identity.HashAPIKey(body.APIKey))
		if !ok {
			answer.WriteProblem(w, answer.BadRequest("no client has this API key"))
			return
		}
		client = c
	case body.Client != "":
		c, ok := g.cfg.ClientByName(body.Client)
		if !ok {
			answer.WriteProblem(w, answer.BadRequest(fmt.Sprintf("no client is named %q", body.Client)))
			return
		}
		client = c
	case body.Key != "":
		who = identity.Identity{Key: "key:" + body.Key, Source: "api"}
	default:
		answer.WriteProblem(w, answer.BadRequest(`give "client", "api_key" or "key"`))
		return
	}
	if client != nil {
		who = identity.Identity{Client: client.Name, Key: client.Name, Source: "api"}
	}
	req, ok := g.policies.Named(who, client, body.Policy)
	if !ok {
		answer.WriteProblem(w, answer.BadRequest(fmt.Sprintf("no policy is named %q", body.Policy)))
		return
	}
	if body.Cost != nil {
		req.Cost = *body.Cost
	}
	if len(req.Limits) == 0 {
		answer.WriteProblem(w, answer.BadRequest("no policy applies to this request"))
		return
	}
	v := g.Decide(r.Context(), &req)
	defer v.Release()
	if v.Outcome == decision.Failed {
		answer.WriteProblem(w, v.Problem)
		return
	}
	answer.Headers(w.Header(), v.Decisions, g.cfg.Limits.LegacyHeaders)
	out := struct {
		Allowed   bool            `json:"allowed"`
		Client    string          `json:"client,omitempty"`
		Decisions []checkDecision `json:"decisions"`
	}{Allowed: v.Passes(), Client: req.Who.Client}
	for i, a := range v.Decisions {
		d := a.Decision
		out.Decisions = append(out.Decisions, checkDecision{Policy: a.Policy.Name, Allowed: d.Allowed, DryRun: req.Limits[i].DryRun,
			Limit: d.Limit, Remaining: d.Remaining, RetryAfterMs: ms(d.RetryAfter), ResetAfterMs: ms(d.ResetAfter), DelayMs: ms(d.Delay)})
	}
	w.Header().Set("Content-Type", "application/json")
	if !v.Passes() {
		w.Header().Set("Retry-After", answer.RetryAfter(v.RetryAfter(&req)))
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_ = json.NewEncoder(w).Encode(out)
}

func ms(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return float64(d.Microseconds()) / 1000
}
