package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway/answer"
	"github.com/sluicehq/sluice/gateway/identity"
	"github.com/sluicehq/sluice/gateway/operator"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/web"
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
	metrics  *Metrics
	registry *prometheus.Registry
	log      *slog.Logger
}

// NewServer opens cfg's store and returns a Server for it; path is the file Reload reads.
func NewServer(cfg *config.Config, path string, log *slog.Logger) (*Server, error) {
	s := &Server{path: path, log: log, registry: prometheus.NewRegistry()}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = NewMetrics(s.registry)
	var raw sluice.Store
	switch cfg.Store.Type {
	case config.StoreRedis:
		var err error
		if raw, s.ping, s.closer, err = openRedis(cfg.Store.RedisOptions(), log); err != nil {
			return nil, err
		}
	default:
		raw = memory.New(cfg.Store.MemoryOptions()...)
		s.ping, s.closer = func(context.Context) error { return nil }, func() {}
	}
	opts := []sluice.Option{sluice.WithFailureMode(cfg.Store.OnError)}
	if cfg.Store.OnError == sluice.FailLocal {
		opts = []sluice.Option{sluice.WithLocalFallback(memory.New(cfg.Store.MemoryOptions()...), cfg.Store.LocalShare)}
	}
	guarded, err := sluice.Guard(raw, opts...)
	if err != nil {
		s.closer()
		return nil, err
	}
	s.store = guarded
	g, err := New(cfg, s.store, s.metrics, nil)
	if err != nil {
		s.closer()
		return nil, err
	}
	s.current.Store(g)
	s.cfg.Store(cfg)
	return s, nil
}

// Config returns the configuration running now.
func (s *Server) Config() *config.Config { return s.cfg.Load() }

// ServeHTTP serves a request on the current configuration with the net/http engine.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.current.Load().ServeHTTP(w, r) }

// ServeFast serves a request on the current configuration with the fasthttp engine.
func (s *Server) ServeFast(ctx *fasthttp.RequestCtx) { s.current.Load().ServeFast(ctx) }

// Limits of the proxy listener (the fasthttp engine's).
var headerTimeout = 10 * time.Second // to read a request's header; a variable for the tests

const (
	bodyTimeout    = time.Hour // to read a body that streams (an upload)
	idleTimeout    = 120 * time.Second
	maxHeaderBytes = 32 << 10 // a request's header, with its line; larger ones get 431
	maxBufferBody  = 64 << 10 // larger bodies are streamed to the upstream, not buffered
)

// FastServer returns the proxy listener's server: the fasthttp engine serving s, with the
// timeouts and limits above, bodies streamed both ways, and errors logged to log.
func (s *Server) FastServer() *fasthttp.Server {
	headerTimeout := headerTimeout
	return &fasthttp.Server{
		Handler: s.ServeFast,
		// The header must come within headerTimeout; a body that streams gets bodyTimeout.
		ReadTimeout: headerTimeout,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if h.ContentLength() != 0 {
				return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
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
		Logger:                       fastLogger{s.log},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			status, detail := fasthttp.StatusBadRequest, "the request could not be read as HTTP/1.1"
			var big *fasthttp.ErrSmallBuffer
			switch {
			case errors.As(err, &big):
				status, detail = fasthttp.StatusRequestHeaderFieldsTooLarge, "the request's header is over 32 KiB"
			case isTimeout(err):
				status, detail = fasthttp.StatusRequestTimeout, fmt.Sprintf("the request's header did not arrive within %v", headerTimeout)
			}
			// Not err's text: fasthttp's can quote the request, and with it a credential.
			writeProblem(ctx, answer.Problem{Type: answer.TypeBlank, Title: fasthttp.StatusMessage(status), Status: status, Detail: detail})
			ctx.SetConnectionClose()
		},
	}
}

// fastLogger sends fasthttp's own messages to the log, as warnings, without their arguments:
// those can quote a request, and with it a credential.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) { l.log.Warn("http server", "message", format) }

// ErrStoreChanged is returned by Reload for a file whose store section differs: the store's
// connections cannot be swapped under running requests; restart to change it.
var ErrStoreChanged = errors.New("the store section changed; restart sluice to change the store")

// Reload reads the configuration file again and, if it is valid, swaps it in; otherwise the
// running configuration stays and the error (with its lines) is returned, logged and counted.
func (s *Server) Reload() error {
	err := s.reload()
	if err != nil {
		s.metrics.reloads.WithLabelValues("failed").Inc()
		s.log.Error("configuration not reloaded; the previous one keeps running", "file", s.path, "error", err.Error())
		return err
	}
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.log.Info("configuration reloaded", "file", s.path, "config", s.cfg.Load().String())
	return nil
}

func (s *Server) reload() error {
	if s.path == "" {
		return errors.New("the demo has no configuration file to reload")
	}
	cfg, err := config.Load(s.path)
	if err != nil {
		return err
	}
	old := s.cfg.Load()
	if !reflect.DeepEqual(cfg.Store, old.Store) {
		return ErrStoreChanged
	}
	if cfg.Listen != old.Listen || cfg.AdminListen != old.AdminListen || !reflect.DeepEqual(cfg.TLS, old.TLS) {
		s.log.Warn("listen, admin_listen and tls take effect at the next restart", "file", s.path)
	}
	g, err := New(cfg, s.store, s.metrics, s.current.Load().Upstream())
	if err != nil {
		return err
	}
	s.current.Store(g)
	s.cfg.Store(cfg)
	return nil
}

// Close closes the store.
func (s *Server) Close() { s.closer() }

// Admin returns the admin listener's handler: /metrics (Prometheus), /healthz (the process is
// up), /readyz (the store answers), POST /v1/check (the decision API), GET /v1/stats and the
// operator page that shows them (/operator/), and the browser simulation (/).
func (s *Server) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		// Ready is the store answering a ping now, not the breaker's state: the breaker closes
		// only when a request probes the store, and a load balancer that stopped sending
		// requests to a not-ready instance would never let it.
		if err := s.ping(r.Context()); err != nil {
			answer.WriteProblem(w, answer.StoreUnavailable("", time.Second))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("POST /v1/check", s.check)
	mux.HandleFunc("GET /v1/stats", s.stats)
	mux.Handle("GET /operator/", http.StripPrefix("/operator/", operator.Handler()))
	mux.Handle("GET /", web.Handler()) // the browser simulation, and what no other pattern matches
	return mux
}

// Stats is the body of GET /v1/stats: what the operator page shows.
type Stats struct {
	Time          time.Time     `json:"time"`
	UptimeSeconds float64       `json:"uptime_s"`
	RateSeconds   int           `json:"rate_s"` // the seconds the per-second rates average over
	Config        string        `json:"config"` // the running configuration, in one line (no secrets)
	Store         StoreStats    `json:"store"`
	Clients       []ClientStats `json:"clients"` // the limited first, then by name
}

// StoreStats is the store's health as the gateway sees it.
type StoreStats struct {
	Type      string `json:"type"`     // memory or redis
	OnError   string `json:"on_error"` // the failure mode: fail-closed, fail-open or local
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"` // why it is not reachable
	// BreakerOpen: decisions do not go to the store now (it failed; the failure mode decides)
	// until a probe finds it back.
	BreakerOpen bool   `json:"breaker_open"`
	Errors      uint64 `json:"errors"`    // requests refused with 503 because the store could not decide
	Fallbacks   uint64 `json:"fallbacks"` // decisions the failure mode made instead of the store
}

// stats serves GET /v1/stats.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	cfg := s.cfg.Load()
	st := Stats{Time: now.UTC(), UptimeSeconds: now.Sub(s.metrics.activity.started).Seconds(), Config: cfg.String()}
	st.Clients, st.RateSeconds = s.metrics.activity.snapshot(now)
	st.Store = StoreStats{Type: cfg.Store.Type, OnError: cfg.Store.OnError.String(), Reachable: true,
		Errors: s.metrics.storeErrorTotal(), Fallbacks: s.metrics.fallbacks.Load()}
	if a, ok := s.store.(sluice.Available); ok {
		st.Store.BreakerOpen = !a.Available()
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.ping(ctx); err != nil {
		st.Store.Reachable, st.Store.Error = false, err.Error()
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
	var body checkRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		answer.WriteProblem(w, answer.BadRequest("the body must be JSON like {\"client\":\"partner-a\",\"policy\":\"standard\",\"cost\":1}: "+err.Error()))
		return
	}
	req := request{client: "anonymous", cost: 1}
	if body.Cost != nil {
		req.cost = *body.Cost
	}
	var client *config.Client
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
		req.who = identity.Identity{Key: "key:" + body.Key, Source: "api"}
	default:
		answer.WriteProblem(w, answer.BadRequest(`give "client", "api_key" or "key"`))
		return
	}
	if client != nil {
		req.client = client.Name
		req.who = identity.Identity{Client: client.Name, Key: client.Name, Source: "api"}
	}
	if body.Policy != "" {
		a, ok := g.cfg.Applied(body.Policy)
		if !ok {
			answer.WriteProblem(w, answer.BadRequest(fmt.Sprintf("no policy is named %q", body.Policy)))
			return
		}
		req.applied = []config.AppliedPolicy{a}
	} else {
		req.applied = g.cfg.AppliedPoliciesFor(client, nil)
	}
	if len(req.applied) == 0 {
		answer.WriteProblem(w, answer.BadRequest("no policy applies to this request"))
		return
	}
	allowed, err := g.decide(r.Context(), &req)
	defer req.release()
	if err != nil {
		answer.WriteProblem(w, g.failure(&req, err))
		return
	}
	answer.Headers(w.Header(), req.decision, g.cfg.Limits.LegacyHeaders)
	out := struct {
		Allowed   bool            `json:"allowed"`
		Client    string          `json:"client,omitempty"`
		Decisions []checkDecision `json:"decisions"`
	}{Allowed: allowed, Client: req.who.Client}
	for i, a := range req.decision {
		d := a.Decision
		out.Decisions = append(out.Decisions, checkDecision{Policy: a.Policy.Name, Allowed: d.Allowed, DryRun: req.applied[i].DryRun,
			Limit: d.Limit, Remaining: d.Remaining, RetryAfterMs: ms(d.RetryAfter), ResetAfterMs: ms(d.ResetAfter), DelayMs: ms(d.Delay)})
	}
	w.Header().Set("Content-Type", "application/json")
	if !allowed {
		w.Header().Set("Retry-After", answer.RetryAfter(answer.Wait(refusedOnes(req.decision, req.applied))))
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
