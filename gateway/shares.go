package gateway

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
)

// Each instance's share of a client's approvals (diagnosis.shares): this instance counts what it
// approves per client and policy, net of what settlements give back or add (a refund, a request
// shed for load, cost_from's real cost: decision.LimitSettleObserver), in the policy's own windows
// (epoch-aligned, of its period: the windows a fixed or sliding window counts in; a decision is
// in the window of its instant on the store's clock, and so is its settlement), the current one
// and the one before; the instance registry's heartbeat carries those counts to Redis and reads
// every instance's back (store/redis Fleet), so that any instance shows who approved what. In
// one window, a shared counter approves at most what the policy allows in one: more, added over
// the instances, means that they do not count together.
//
// Bounded: one entry per configured client (or "anonymous") and policy state name decided,
// maxShareEntries in all (configured names, not client input; the heartbeat carries at most 64).

// maxShareEntries bounds the entries (client and policy) one instance counts.
const maxShareEntries = 4096

// fleetMaxCounts is how many counts one heartbeat carries (store/redis MaxFleetCounts).
const fleetMaxCounts = 64

// sharesShown is how many client and policy rows the diagnosis lists, the most approved first.
const sharesShown = 50

// Shares counts this instance's approvals for the instance registry. The zero value is an
// empty count (NewShares); a nil *Shares records nothing (no registry).
type Shares struct {
	m cowMap[[2]string, *shareWindows] // client, policy state name
}

// NewShares returns an empty count.
func NewShares() *Shares { return &Shares{} }

type shareWindows struct {
	mu        sync.Mutex
	policy    sluice.Policy // as last decided (a reload may change it: its count starts again)
	n         int64         // the window of cur: unix µs / period
	cur, prev int64         // cost approved in windows n and n-1
}

// ShareCount is one instance's approvals of one client under one policy, in the policy's windows,
// as this instance counts them or as another's heartbeat carried them.
type ShareCount struct {
	Client string        `json:"client"` // a configured client's name, or "anonymous"
	Policy string        `json:"policy"` // the name its state is kept under (the policy's, or a route's scope)
	Period time.Duration `json:"period_ns"`
	// Window is the number of the current window (unix µs / period); Current and Previous the
	// cost approved in it and in the one before.
	Window   int64 `json:"window"`
	Current  int64 `json:"current"`
	Previous int64 `json:"previous"`
	// Allowed is the most one shared counter approves in one window of the policy (allowedPerWindow).
	Allowed int64 `json:"allowed"`
}

// allowedPerWindow is the most one counter, shared by every instance, approves of p in one
// epoch-aligned window of its period: the limit for the window algorithms (a sliding window
// counts the window's own approvals up to the limit, a sliding log any period's); for a token
// bucket its capacity plus what refills in a period; for a leaky bucket the one served, its
// queue and what drains in a period. 0: not a rate over a period (no finding is made from it).
func allowedPerWindow(p sluice.Policy) int64 {
	if !windowed(p) {
		return 0
	}
	switch p.Algorithm {
	case algorithm.FixedWindow, algorithm.SlidingWindow, algorithm.SlidingLog:
		return p.Limit
	case algorithm.TokenBucket:
		capacity := p.Burst
		if capacity == 0 {
			capacity = p.Limit
		}
		return capacity + p.Limit
	case algorithm.LeakyBucket:
		return p.Limit + p.Burst + 1
	}
	return 0
}

// counted reports whether the shares count limit i of req, decided as dec: a limit that is the
// client's own (not a key_by tuple's, not a dry run), that allowed, of a policy with windows.
func counted(req *decision.Request, i int, p *sluice.Policy, dec *sluice.Decision) bool {
	l := &req.Limits[i]
	return !l.DryRun && l.KeyBy == nil && l.Key == "" && dec.Allowed && windowed(*p)
}

// decidedAt is the instant (unix µs) whose window holds a decision: its instant on the store's
// clock, or now if it has none.
func decidedAt(dec *sluice.Decision, now time.Time) int64 {
	if dec.At > 0 {
		return dec.At
	}
	return now.UnixMicro()
}

// record counts what the verdict approved of req (decided at now, if its decisions say no
// instant): the cost of each counted limit, if the request passed.
func (s *Shares) record(req *decision.Request, v *decision.Verdict, now time.Time) {
	if s == nil || !v.Passes() {
		return
	}
	for i, a := range v.Decisions {
		if i >= len(req.Limits) || !counted(req, i, &a.Policy, &a.Decision) {
			continue
		}
		cost := req.LimitCost(i)
		if cost <= 0 {
			continue
		}
		k := [2]string{req.Client, a.Policy.Name}
		w := s.m.all()[k]
		if w == nil {
			if len(s.m.all()) >= maxShareEntries {
				continue
			}
			w = s.m.get(k, func() *shareWindows { return &shareWindows{policy: a.Policy} }) // (never a zero period)
		}
		w.add(a.Policy, decidedAt(&a.Decision, now), cost)
	}
}

// settled takes what a settlement of limit i of req changed (estimate charged by dec, actual
// now) off its decision's window: approvals are counted net of refunds and of requests shed for
// load. Nothing if that window is no longer counted, or the policy was reloaded since.
func (s *Shares) settled(req *decision.Request, i int, dec sluice.Decision, estimate, actual int64, now time.Time) {
	if s == nil || i >= len(req.Limits) || estimate == actual || !counted(req, i, &req.Limits[i].Policy, &dec) {
		return
	}
	p := req.Limits[i].Policy
	w := s.m.all()[[2]string{req.Client, p.Name}]
	if w == nil {
		return
	}
	n := decidedAt(&dec, now) / p.Period.Microseconds()
	w.mu.Lock()
	defer w.mu.Unlock()
	if p != w.policy {
		return
	}
	switch n {
	case w.n:
		w.cur = max(0, w.cur+actual-estimate)
	case w.n - 1:
		w.prev = max(0, w.prev+actual-estimate)
	}
}

// LimitSettled takes a settlement off this instance's approvals (decision.LimitSettleObserver).
func (o observer) LimitSettled(req *decision.Request, i int, dec sluice.Decision, estimate, actual int64) {
	o.g.metrics.diag.shares.settled(req, i, dec, estimate, actual, time.Now())
}

func (w *shareWindows) add(p sluice.Policy, at int64, cost int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p != w.policy {
		w.policy, w.n, w.cur, w.prev = p, 0, 0, 0
	}
	n := at / p.Period.Microseconds()
	switch {
	case n == w.n:
	case n == w.n+1:
		w.n, w.prev, w.cur = n, w.cur, 0
	default: // (a later window, or the clock went back: start again)
		w.n, w.prev, w.cur = n, 0, 0
	}
	w.cur += cost
}

// Counts returns this instance's approvals at now, in the windows current at now: what the
// heartbeat carries. Entries with nothing approved in either window are left out.
func (s *Shares) Counts(now time.Time) []ShareCount {
	var out []ShareCount
	for k, w := range s.m.all() {
		w.mu.Lock()
		p := w.policy
		if p.Period.Microseconds() <= 0 { // (none is made so; a division by zero must not stop the heartbeats)
			w.mu.Unlock()
			continue
		}
		n := now.UnixMicro() / p.Period.Microseconds()
		c := ShareCount{Client: k[0], Policy: k[1], Period: p.Period, Window: n, Allowed: allowedPerWindow(p)}
		switch w.n {
		case n:
			c.Current, c.Previous = w.cur, w.prev
		case n - 1:
			c.Previous = w.cur
		}
		w.mu.Unlock()
		if c.Current > 0 || c.Previous > 0 {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b ShareCount) int {
		return cmp.Or(cmp.Compare(a.Client, b.Client), cmp.Compare(a.Policy, b.Policy))
	})
	return out
}

// SharesStats is diagnosis.shares: each live instance's approvals of each client, from the
// instance registry (a Redis store; nil with the memory store, which sees no other instance).
type SharesStats struct {
	Instances int `json:"instances"` // live in the registry
	// Listed is the instances whose counts the last heartbeat read (the most recently heard
	// from, up to 64); each carries at most MaxCounts counts, the most approved, and Dropped is
	// how many they left out over that.
	Listed    int           `json:"listed"`
	MaxCounts int           `json:"max_counts_per_instance"`
	Dropped   int           `json:"dropped"`
	Clients   []ClientShare `json:"clients"` // the most approved first, at most sharesShown
}

// ClientShare is one client's approvals under one policy, in its latest window, by instance.
type ClientShare struct {
	Client string `json:"client"`
	Policy string `json:"policy"`
	Period string `json:"period"`
	// WindowStart is the start of the latest window an instance reported (by its clock);
	// Total is what the instances approved in it so far (as of each one's last heartbeat) and
	// PreviousTotal in the window before.
	WindowStart   time.Time `json:"window_start"`
	Total         int64     `json:"total"`
	PreviousTotal int64     `json:"previous_total"`
	// Allowed is the most one shared counter approves in one window, by the most generous of
	// the instances' configurations (they may differ: each instance says its own).
	Allowed   int64           `json:"allowed"`
	Instances []InstanceShare `json:"instances"` // every listed instance, by id
}

// InstanceShare is one instance's part of a ClientShare.
type InstanceShare struct {
	ID       string  `json:"id"`
	Approved int64   `json:"approved"`  // in the window
	Share    float64 `json:"share_pct"` // of Total, in percent (0 if Total is 0)
	Previous int64   `json:"previous"`  // in the window before
	Allowed  int64   `json:"allowed"`   // per window, by its configuration (0: it approved nothing)
}

// fleetShares gathers the instances' counts of the registry by client and policy, and the
// findings they prove: in one window, more approved than one shared counter allows.
func fleetShares(f *FleetStats, maxCounts int) (*SharesStats, []Finding) {
	out := &SharesStats{Instances: f.Instances, Listed: len(f.Members), MaxCounts: maxCounts, Clients: []ClientShare{}}
	type key struct {
		client, policy string
		period         time.Duration // (instances that differ on it count in other windows: other rows)
	}
	type group struct {
		window int64                 // the latest reported
		counts map[string]ShareCount // by instance id
	}
	groups := map[key]*group{}
	ids := make([]string, 0, len(f.Members))
	for _, m := range f.Members {
		ids = append(ids, m.ID)
		out.Dropped += m.Dropped
		for _, c := range m.Counts {
			k := key{c.Client, c.Policy, c.Period}
			g := groups[k]
			if g == nil {
				g = &group{window: c.Window, counts: map[string]ShareCount{}}
				groups[k] = g
			}
			g.window = max(g.window, c.Window)
			g.counts[m.ID] = c
		}
	}
	sort.Strings(ids)
	var findings []Finding
	for k, g := range groups {
		cs := ClientShare{Client: k.client, Policy: k.policy, Period: k.period.String(), WindowStart: time.UnixMicro(g.window * k.period.Microseconds()).UTC()}
		allowed := map[int64][]string{}
		for _, id := range ids {
			in := InstanceShare{ID: id}
			if c, ok := g.counts[id]; ok {
				switch c.Window {
				case g.window:
					in.Approved, in.Previous = c.Current, c.Previous
				case g.window - 1:
					in.Previous = c.Current
				}
				if in.Approved > 0 || in.Previous > 0 {
					in.Allowed = c.Allowed
					allowed[c.Allowed] = append(allowed[c.Allowed], id)
				}
			}
			cs.Total += in.Approved
			cs.PreviousTotal += in.Previous
			cs.Allowed = max(cs.Allowed, in.Allowed)
			cs.Instances = append(cs.Instances, in)
		}
		if cs.Total == 0 && cs.PreviousTotal == 0 {
			continue
		}
		for i := range cs.Instances {
			if cs.Total > 0 {
				cs.Instances[i].Share = float64(cs.Instances[i].Approved) * 100 / float64(cs.Total)
			}
		}
		out.Clients = append(out.Clients, cs)
		if f := separateCounters(cs, allowed); f != nil {
			findings = append(findings, *f)
		}
	}
	sort.Slice(out.Clients, func(i, j int) bool {
		a, b := out.Clients[i], out.Clients[j]
		if a.Total+a.PreviousTotal != b.Total+b.PreviousTotal {
			return a.Total+a.PreviousTotal > b.Total+b.PreviousTotal
		}
		return a.Client+"/"+a.Policy < b.Client+"/"+b.Policy
	})
	out.Clients = out.Clients[:min(sharesShown, len(out.Clients))]
	sort.Slice(findings, func(i, j int) bool { return findings[i].Subject < findings[j].Subject })
	return out, findings
}

// separateCounters is the finding of cs, if its instances approved more in one window than one
// shared counter allows in one (allowed: the instances by the allowance their configuration
// says). Not for anonymous clients: each address has counters of its own.
func separateCounters(cs ClientShare, allowed map[int64][]string) *Finding {
	if cs.Client == identity.AnonymousKey || cs.Allowed <= 0 {
		return nil
	}
	total, which, get := cs.Total, "one window (from "+cs.WindowStart.Format(time.RFC3339)+")", func(in InstanceShare) int64 { return in.Approved }
	if total <= cs.Allowed {
		total, which, get = cs.PreviousTotal, "the window before "+cs.WindowStart.Format(time.RFC3339), func(in InstanceShare) int64 { return in.Previous }
	}
	if total <= cs.Allowed {
		return nil
	}
	var parts []string
	n := 0
	for _, in := range cs.Instances {
		if get(in) > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", in.ID, get(in)))
			n++
		}
	}
	differ := ""
	if len(allowed) > 1 {
		var says []string
		for a, ids := range allowed {
			says = append(says, fmt.Sprintf("%d on %s", a, strings.Join(ids, ", ")))
		}
		sort.Strings(says)
		differ = "; their configurations of it differ (allowed per window: " + strings.Join(says, "; ") + ")"
	}
	return &Finding{Kind: "separate_counters", Subject: cs.Client,
		Summary: fmt.Sprintf("%s was approved %d under %s (per %s) in %s by %d instances (%s), more than one shared counter allows in a window (%d): the instances do not count together%s",
			cs.Client, total, cs.Policy, cs.Period, which, n, strings.Join(parts, ", "), cs.Allowed, differ),
		Do: "give every instance the same store (the same Redis and store.prefix) and the same configuration of this policy (an instance whose policy differs in name, algorithm or period counts apart, and resets the others' counts; one whose limit alone differs shares the count but holds it to its own limit); an instance deciding on the local fallback with a whole local_share, or fail-open, while Redis fails it, counts alone too"}
}
