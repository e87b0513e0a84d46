package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	"net/http"

	"github.com/sluicehq/sluice/clients"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// UseClients runs the clients m manages (the clients API's, from the store's registry) beside
// the file's: every configuration the Server runs from now on — this one, reloads, and each
// change m applies — is the file's merged with m's records (clients.Manager.Merge), and the
// clients API is served on the admin listener (call it before Admin). m must have synced once;
// start m.Run after.
func (s *Server) UseClients(m *clients.Manager) error {
	s.clients = m
	m.SetApply(func() {
		if err := s.refresh(); err != nil {
			s.log.Error("clients registry: the clients could not be merged; the running ones stay", "error", err.Error())
		}
	})
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_clients", Help: clientsHelp,
		ConstLabels: prometheus.Labels{"source": "api"}}, func() float64 { return float64(m.Status().FromAPI) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_clients", Help: clientsHelp,
			ConstLabels: prometheus.Labels{"source": "file"}}, func() float64 { return float64(m.Status().FromFile) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_clients_not_running",
			Help: "The clients API's records that cannot run under the configuration (a policy gone, a key another client has): /v1/stats says why."},
			func() float64 { return float64(len(m.Status().Dropped)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_clients_read_timestamp_seconds",
			Help: "When this instance last read the clients API's records from the store (unix seconds); 0 if never."},
			func() float64 {
				if t := m.Status().SyncedAt; !t.IsZero() {
					return float64(t.UnixNano()) / 1e9
				}
				return 0
			}))
	api := &clients.API{M: m, Config: s.Config, Base: func() *config.Config { return s.base.Load() }, Writer: s.writer, Log: s.log}
	api.Mount(func(pattern string, h http.Handler) { s.Mount(pattern, h) })
	if err := s.refresh(); err != nil {
		return err
	}
	m.Apply() // (the status's version: what this instance runs)
	return nil
}

const clientsHelp = "Clients running, by where they come from: the clients API (api) or the configuration file (file)."

// merged is cfg (a file's, adjusted) with the clients API's clients, if the Server has them.
func (s *Server) merged(cfg *config.Config) (*config.Config, error) {
	if s.clients == nil {
		return cfg, nil
	}
	return s.clients.Merge(cfg)
}

// refresh runs the running file's configuration merged anew with the clients API's records:
// what a change of them does. It keeps the running Gateway's connections and early-retry memory.
func (s *Server) refresh() error {
	s.swap.Lock()
	defer s.swap.Unlock()
	cfg, err := s.merged(s.base.Load())
	if err != nil {
		return err
	}
	cur := s.current.Load()
	g, err := s.gateway(cfg, cur.Upstream())
	if err != nil {
		return err
	}
	g.retries = cur.retries
	s.run(cfg, g)
	return nil
}

// writer says who may write through the clients API with r: the name of the admin token it
// carries (the admin listener has checked it). Without a token configured nobody may: a write
// changes who is limited and how, and a listener without a token lets anyone who reaches it in.
func (s *Server) writer(r *http.Request) (who, why string) {
	a := s.cfg.Load().Admin
	if !a.HasToken() {
		return "", "the clients API's writes need an admin token: set admin.token_env or admin.tokens (and send Authorization: Bearer TOKEN); reads work without one"
	}
	got, _ := identity.BearerToken(r.Header.Get("Authorization"))
	if who := a.AdminTokenFor(got); who != "" {
		return who, ""
	}
	return "", "the admin listener wants Authorization: Bearer TOKEN (admin.token_env or admin.tokens)"
}

// ClientsStatus is what the Server runs of the clients API's records (nil: it has none).
func (s *Server) ClientsStatus() *clients.Status {
	if s.clients == nil {
		return nil
	}
	st := s.clients.Status()
	return &st
}
