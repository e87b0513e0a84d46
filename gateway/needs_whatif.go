package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// WhatIf is GET /v1/clients/{name}/needs?policy=P&limit=N: what a proposed limit (and period,
// and algorithm) would have done to the client's requests of the last day, as the simulator
// (package sim: the same limiter, on a virtual clock) finds by replaying its recorded timeline.
type WhatIf struct {
	Client   string      `json:"client"`
	Policy   string      `json:"policy"`
	Current  PolicyShape `json:"current"`
	Proposed PolicyShape `json:"proposed"`
	// From and To bound the replayed timeline: the minutes of the last day the client sent in.
	From *time.Time `json:"from,omitempty"`
	To   *time.Time `json:"to,omitempty"`
	// Offered is the requests replayed, WouldRefuse those the proposed policy refuses, and
	// RefusedAsRecorded those the policy refused when they came.
	Offered           int64 `json:"offered"`
	WouldRefuse       int64 `json:"would_refuse"`
	RefusedAsRecorded int64 `json:"refused_as_recorded"`
	// NotReplayed is the earliest requests of the day left out so that at most maxReplay
	// are replayed (their minutes are not in From..To).
	NotReplayed int64 `json:"not_replayed"`
}

// PolicyShape is the numbers of a policy that a what-if may change.
type PolicyShape struct {
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Burst     int64  `json:"burst,omitempty"`
	Window    string `json:"window"`
}

func shapeOf(p sluice.Policy) PolicyShape {
	return PolicyShape{Algorithm: p.Algorithm.String(), Limit: p.Limit, Burst: p.Burst, Window: windowName(p)}
}

// whatIf replays the series' last day (up to now, µs) under proposed. Every request of a
// second is replayed in it, spread evenly over it, each costing its minute's mean cost (the
// minute's units shared out: exact when every request cost the same). The replay starts with
// the policy's state empty at the first minute the client sent in.
// Replayer starts a replay: requests decided one after another, on a virtual clock that starts
// at start, under policy p alone, as the simulator decides them (sim.Replay: the composition root
// gives it, Server.SetReplayer — a front end opens no store, not even the simulator's). decide
// takes a request's time (µs since start, non-decreasing) and cost, and says whether it passed.
type Replayer func(p sluice.Policy, start time.Time) (decide func(tMicros, cost int64) (bool, error), err error)

// maxReplay is the most requests a what-if replays (the simulator's bound on one run).
const maxReplay = 1_000_000

// SetReplayer gives the what-if its replay (nil: what-ifs are answered 501). Call it before serving.
func (s *Server) SetReplayer(r Replayer) { s.replay = r }

// testReplayer is every new Server's replay in this package's tests (export_test.go); nil else.
var testReplayer Replayer

func (s *needSeries) whatIf(replay Replayer, proposed sluice.Policy, now int64) (WhatIf, error) {
	nowMin := floorDiv(now, 60e6)
	s.mu.Lock()
	current := s.policy
	pages := make([]needPage, 0, needsMinutes)
	for _, pg := range s.pages {
		if pg != nil && pg.min > nowMin-needsMinutes && pg.min <= nowMin {
			pages = append(pages, *pg)
		}
	}
	s.mu.Unlock()
	sort.Slice(pages, func(i, j int) bool { return pages[i].min < pages[j].min })
	out := WhatIf{Policy: s.name, Current: shapeOf(current), Proposed: shapeOf(proposed)}
	var total int64
	for i := range pages {
		total += pages[i].requests()
	}
	for len(pages) > 0 && total > maxReplay {
		n := pages[0].requests()
		total -= n
		out.NotReplayed += n
		pages = pages[1:]
	}
	if len(pages) == 0 {
		return out, nil
	}
	origin := pages[0].min * 60 // unix seconds of the virtual clock's 0
	from, to := time.Unix(origin, 0).UTC(), time.Unix((pages[len(pages)-1].min+1)*60, 0).UTC()
	out.From, out.To = &from, &to
	decide, err := replay(proposed, from)
	if err != nil {
		return out, err
	}
	for i := range pages {
		pg := &pages[i]
		n := pg.requests()
		base, extra := pg.units/max(n, 1), pg.units%max(n, 1)
		k := int64(0)
		for j, c := range pg.reqs {
			sec := pg.min*60 + int64(j) - origin
			for q := int64(0); q < int64(c); q++ {
				cost := base
				if k < extra {
					cost++
				}
				k++
				allowed, err := decide(sec*1e6+q*1e6/int64(c), cost)
				if err != nil {
					return out, err
				}
				out.Offered++
				if !allowed {
					out.WouldRefuse++
				}
			}
		}
		out.RefusedAsRecorded += int64(pg.refused)
	}
	return out, nil
}

// requests is the requests of the page's minute.
func (pg *needPage) requests() int64 {
	var n int64
	for _, r := range pg.reqs {
		n += int64(r)
	}
	return n
}

// needsQuery is what GET /v1/clients/{name}/needs takes.
var needsQuery = map[string]bool{"policy": true, "limit": true, "period": true, "algorithm": true}

// needsProblem answers a bad request of GET /v1/clients/{name}/needs: status, and a detail that
// starts with the field at fault.
func needsProblem(w http.ResponseWriter, status int, field, detail string) {
	if field != "" {
		detail = field + ": " + detail
	}
	answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(status), Status: status,
		Detail: detail, Field: field})
}

// clientNeeds serves GET /v1/clients/{name}/needs: the client's use of each policy (a
// NeedsReport); with policy=P, of that policy only; with limit=N (and period=D, algorithm=A), a
// what-if of P under them (a WhatIf).
func (s *Server) clientNeeds(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	if unknownQuery(w, q, needsQuery, "policy, limit, period and algorithm") {
		return
	}
	g := s.current.Load()
	client, configured := g.cfg.ClientByName(name)
	kept := s.metrics.needs.lookup(name)
	if !configured && kept == nil && name != anonymousClient {
		needsProblem(w, http.StatusNotFound, "client", "no client of this name is configured or has sent requests")
		return
	}
	var limits []config.AppliedPolicy
	if configured || name == anonymousClient {
		req, _ := g.policies.Named(identity.Identity{}, client, "")
		limits = req.Limits
	}
	now := s.metrics.now()
	rep := s.metrics.needs.report(name, limits, now)
	policy := q.Get("policy")
	whatIf := q.Has("limit") || q.Has("period") || q.Has("algorithm")
	if policy == "" {
		if whatIf {
			needsProblem(w, http.StatusBadRequest, "policy", "required with limit, period or algorithm: which policy of the client to replay")
			return
		}
		writeJSON(w, rep)
		return
	}
	var found *PolicyNeeds
	for i := range rep.Policies {
		if rep.Policies[i].Policy == policy {
			found = &rep.Policies[i]
		}
	}
	if found == nil {
		needsProblem(w, http.StatusNotFound, "policy", "the client has no policy of this name (see its policies without the policy parameter)")
		return
	}
	if !whatIf {
		rep.Policies = []PolicyNeeds{*found}
		writeJSON(w, rep)
		return
	}
	var series *needSeries
	if kept != nil {
		series = kept.seriesOf(policy, false)
	}
	switch {
	case series == nil:
		needsProblem(w, http.StatusNotFound, "policy", "no request of the client under this policy is kept, so there is nothing to replay")
		return
	case found.Aggregate:
		needsProblem(w, http.StatusBadRequest, "policy", "it counts under other keys than the client's own (anonymous clients by address, or key_by), which the kept use adds up: no one limit applies to the sum")
		return
	}
	series.mu.Lock()
	proposed := series.policy
	series.mu.Unlock()
	proposed, field, err := propose(proposed, q.Get("limit"), q.Get("period"), q.Get("algorithm"))
	if err != nil {
		needsProblem(w, http.StatusBadRequest, field, err.Error())
		return
	}
	if s.replay == nil {
		needsProblem(w, http.StatusNotImplemented, "", "this server has no replay for what-ifs")
		return
	}
	select {
	case s.metrics.needs.replays <- struct{}{}:
		defer func() { <-s.metrics.needs.replays }()
	case <-r.Context().Done():
		return // the asker left while others replayed
	}
	res, err := series.whatIf(s.replay, proposed, now.UnixMicro())
	if err != nil {
		needsProblem(w, http.StatusBadRequest, "policy", "replaying the kept day: "+err.Error())
		return
	}
	res.Client = name
	writeJSON(w, res)
}

// propose changes p by a what-if's query parameters (each "" leaves its part as it is). An error
// comes with the field at fault.
func propose(p sluice.Policy, limit, period, alg string) (sluice.Policy, string, error) {
	if limit != "" {
		n, err := strconv.ParseInt(limit, 10, 64)
		if err != nil || n < 1 || n > algorithm.MaxLimit {
			return p, "limit", fmt.Errorf("%q is not a whole number from 1 to %d", trim(limit), int64(algorithm.MaxLimit))
		}
		p.Limit = n
	}
	if period != "" {
		d, err := time.ParseDuration(period)
		if err != nil || d < time.Millisecond || d%time.Microsecond != 0 {
			return p, "period", fmt.Errorf("%q is not a duration of at least 1ms in whole µs (like 1m, 30s, 1h)", trim(period))
		}
		p.Period, p.Calendar, p.Location = d, sluice.NoCalendar, nil
	}
	if alg != "" {
		a, err := sluice.ParseAlgorithm(alg)
		if err != nil || a == sluice.Concurrency {
			return p, "algorithm", fmt.Errorf("%q is not one of fixed-window, sliding-log, sliding-window, token-bucket, leaky-bucket", trim(alg))
		}
		if a != p.Algorithm && a != sluice.TokenBucket && a != sluice.LeakyBucket {
			p.Burst = 0 // only the buckets take a burst
		}
		p.Algorithm = a
	}
	if p.Calendar != sluice.NoCalendar && p.Algorithm != sluice.FixedWindow && p.Algorithm != sluice.SlidingWindow {
		return p, "period", fmt.Errorf("the policy counts by the calendar (%s), which %v does not: give a period too", p.Calendar, p.Algorithm)
	}
	if err := p.Validate(); err != nil {
		return p, "limit", err
	}
	return p, "", nil
}

// trim shortens a query parameter's value for an error's detail.
func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// unknownQuery answers 400, naming the first query parameter q has that known lacks (cut to 40
// bytes), and reports whether it did; takes says what the endpoint takes.
func unknownQuery(w http.ResponseWriter, q url.Values, known map[string]bool, takes string) bool {
	for k := range q {
		if !known[k] {
			if len(k) > 40 {
				k = k[:40] + "…"
			}
			needsProblem(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q", k), "unknown; this endpoint takes "+takes)
			return true
		}
	}
	return false
}
