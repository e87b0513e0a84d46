package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FleetStats is the instance registry as this instance last read it from Redis (GET /v1/stats
// "fleet", the operator page): the gateway instances sharing the Redis (every Redis store runs
// it), each one's approvals (the diagnosis's shares), and the share of each policy this one
// decides on alone while Redis is down.
type FleetStats struct {
	// Name is the fleet's (store.fleet): only instances of this name on the Redis count here.
	Name string `json:"name"`
	Self string `json:"self"` // this instance's id
	// Instances is the live count at the last heartbeat that reached Redis; 0 if none has.
	Instances int `json:"instances"`
	// FallbackShare is the share of each policy the local fallback decides on: with
	// local_share: fleet 1/n, n the fleet's size — Instances, or more for a TTL after Redis's
	// registry began anew (a restart: until every live instance has heartbeat into it, a lower
	// count is not taken), 1 before any heartbeat reached Redis —, the limit and burst divided by
	// n, rounded down; with a fixed local_share that share; 0 without a local fallback (on_error
	// fail-closed or fail-open).
	FallbackShare float64         `json:"fallback_share"`
	Members       []FleetInstance `json:"members"`           // the live instances (up to 64), the most recently heard from first
	SeenAt        *time.Time      `json:"seen_at,omitempty"` // when that heartbeat was answered (Redis's clock)
	Error         string          `json:"error,omitempty"`   // why the last heartbeat failed
}

// FleetInstance is one live instance of the registry.
type FleetInstance struct {
	ID       string    `json:"id"`
	LastSeen time.Time `json:"last_seen"` // its last heartbeat, by Redis's clock
	// Counts is its approvals as its last heartbeat carried them (Shares.Counts; at most 64,
	// Dropped the others), none if it approved nothing lately or runs a version that sends none.
	Counts  []ShareCount `json:"counts,omitempty"`
	Dropped int          `json:"dropped,omitempty"`
}

// registerFleet adds the registry's gauges: the live instances and the fallback's share (no
// labels: one series each), and the fleet's name (sluice_fleet_info, 1 with the name as its
// label; it cannot change without a restart).
func (s *Server) registerFleet(fleet func() FleetStats) {
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_fleet_info",
		Help:        "1, labelled with the name of this instance's fleet (store.fleet): the instances counted by sluice_fleet_instances.",
		ConstLabels: prometheus.Labels{"fleet": fleet().Name}}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_fleet_instances",
			Help: "Gateway instances of this fleet sharing the Redis (registered with a heartbeat), as last seen; 0 until a heartbeat reached it."},
			func() float64 { return float64(fleet().Instances) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_fallback_share",
			Help: "The share of each policy this instance decides on alone while Redis is down (on_error: local, local_share: fleet): 1/instances (the higher count seen for a TTL after Redis's registry began anew)."},
			func() float64 { return fleet().FallbackShare }))
}
