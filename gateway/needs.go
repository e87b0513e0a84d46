package gateway

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
)

// needs is what each client used of each policy that applies to it, so that an operator can see
// how much it needs for its normal work beside its limit (GET /v1/clients/{name}/needs): the
// units it consumed in each window of the policy (each fixed window of its period, or calendar
// window; for the buckets, each period), kept for needsDays days, and the requests it sent in
// each second of the last day, which the what-if replays (needs_whatif.go).
//
// It is keyed by the client's name (configured, made at runtime, or "anonymous" for every client
// that is not one, whatever its address or key: they aggregate into one entry), and bounded:
//
//   - at most maxNeedsClients clients: a new one beyond them takes the place of the least
//     recently active one (whose record is lost);
//   - at most maxNeedsPolicies policies per client: a further one (after a reload that renamed
//     them) takes the place of the client's least recently used;
//   - per client and policy (a needSeries): needsDays per-day histograms of needsBuckets 4-byte
//     counts (a window's use in one of them, within 12.5%), and, for the last day, at most
//     needsMinutes minute pages of needPageBytes (a minute page is made the first time the
//     client sends in that minute, and reused a day later).
//
// So the whole is at most maxNeedsClients × maxNeedsPolicies × (needsDays × needsBuckets × 4 B +
// needsMinutes × (8 B + needPageBytes)) plus a few hundred bytes per series: 128 × 4 × (11.4 KiB
// + 213.8 KiB) ≈ 113 MiB for 512 series each sent to in every minute of the day; a client that
// sent in m minutes of the last day holds m × needPageBytes of timeline.
//
// Recording (decided) takes the series' lock and allocates nothing once the client's minute
// page for the current minute exists (in steady state: once a day has passed).
type needs struct {
	clients atomic.Pointer[map[string]*clientNeeds]
	mu      sync.Mutex // serialises adding and evicting clients
	max     int        // maxNeedsClients, but for a test
	// replays bounds the what-ifs replaying at once (maxReplays); the others wait their turn.
	replays chan struct{}
}

// anonymousClient is the one name of every client that is not configured.
const anonymousClient = "anonymous"

// Bounds of the record (see needs).
const (
	maxNeedsClients  = 128
	maxNeedsPolicies = 4
	needsDays        = 7
	needsMinutes     = 24 * 60
	needsBuckets     = 416
	needPageBytes    = 144 // unsafe.Sizeof(needPage{}), checked by a test
	// needsMinWindows is how many windows with use a series needs before it is flagged.
	needsMinWindows = 30
	// maxReplays is how many what-ifs replay at once (each up to maxReplay decisions).
	maxReplays = 2
)

// clientNeeds is one client's series, one per policy (by its configured name).
type clientNeeds struct {
	name   string
	active atomic.Int64 // unix seconds of its latest request: the least recently active is evicted
	mu     sync.Mutex   // serialises adding series
	series [maxNeedsPolicies]atomic.Pointer[needSeries]
}

// needSeries is one client's use of one policy.
type needSeries struct {
	name   string       // the policy's configured name
	active atomic.Int64 // µs of its latest request: when full, the client's least recently used is replaced

	mu        sync.Mutex
	policy    sluice.Policy // as the latest request saw it (a reload may change it)
	dryRun    bool
	aggregate bool // counted under keys other than the client's own (anonymous, key_by): no flags, no what-if
	// The current window: its start and end (µs), the units consumed in it.
	winStart, winEnd int64
	winUse           int64
	open             bool // a window is open
	days             [needsDays]needDay
	pages            [needsMinutes]*needPage // the last day's minutes, by unix minute % needsMinutes
}

// needDay is one UTC day of a series: the requests it decided, those the policy refused, and the
// use of every window that began that day and has ended (windows with no use are not counted).
type needDay struct {
	day              int64 // unix day; 0 with nothing counted
	offered, refused int64
	windows          int64
	peak             int64
	hist             [needsBuckets]uint32
}

// needPage is one minute of a series: the requests decided in each of its seconds (saturating
// at 65535), the units they asked for, and how many the policy refused.
type needPage struct {
	min     int64 // unix minute
	units   int64
	refused uint32
	reqs    [60]uint16
}

func newNeeds() *needs {
	return &needs{max: maxNeedsClients, replays: make(chan struct{}, maxReplays)}
}

// client returns name's record, made (evicting the least recently active beyond the bound) if
// it has none.
func (n *needs) client(name string, now int64) *clientNeeds {
	if m := n.clients.Load(); m != nil {
		if c, ok := (*m)[name]; ok {
			return c
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.clients.Load()
	next := make(map[string]*clientNeeds, n.max)
	if old != nil {
		if c, ok := (*old)[name]; ok {
			return c
		}
		for k, v := range *old {
			next[k] = v
		}
	}
	if len(next) >= n.max {
		victim, oldest := "", int64(1<<62)
		for k, v := range next {
			if a := v.active.Load(); a < oldest || a == oldest && k < victim {
				victim, oldest = k, a
			}
		}
		delete(next, victim)
	}
	c := &clientNeeds{name: name}
	c.active.Store(now / 1e6)
	next[name] = c
	n.clients.Store(&next)
	return c
}

// lookup returns name's record, if kept.
func (n *needs) lookup(name string) *clientNeeds {
	if m := n.clients.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// seriesOf returns the client's series of policy, made (create) if it has none; nil if it has
// none and create is false.
func (c *clientNeeds) seriesOf(policy string, create bool) *needSeries {
	for i := range c.series {
		s := c.series[i].Load()
		if s == nil {
			break
		}
		if s.name == policy {
			return s
		}
	}
	if !create {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	oldest := 0
	for i := range c.series {
		s := c.series[i].Load()
		if s == nil {
			oldest = i
			break
		}
		if s.name == policy {
			return s
		}
		if s.active.Load() < c.series[oldest].Load().active.Load() {
			oldest = i
		}
	}
	// A free slot, or (full: a reload renamed the client's policies) the least recently used one's.
	s := &needSeries{name: policy}
	c.series[oldest].Store(s)
	return s
}

// all returns the client's series, in the order first seen.
func (c *clientNeeds) all() []*needSeries {
	var out []*needSeries
	for i := range c.series {
		if s := c.series[i].Load(); s != nil {
			out = append(out, s)
		}
	}
	return out
}

// decided records a decided request (the observer's Decided) at now: each of its rate policies'
// cost, consumed or not, refused or not. Concurrency policies limit requests in flight, not a
// rate: they are not recorded.
func (n *needs) decided(req *decision.Request, v *decision.Verdict, now time.Time) {
	if len(v.Decisions) == 0 {
		return
	}
	us := now.UnixMicro()
	c := n.client(req.Client, us)
	if sec := us / 1e6; c.active.Load() != sec {
		c.active.Store(sec)
	}
	passed := v.Passes()
	for i, a := range v.Decisions {
		l := &req.Limits[i]
		if l.Policy.Algorithm == sluice.Concurrency {
			continue
		}
		s := c.seriesOf(l.PolicyName, true)
		agg := req.Client == anonymousClient || l.Key != ""
		s.add(us, &l.Policy, l.DryRun, agg, req.LimitCost(i), passed && a.Decision.Allowed, !a.Decision.Allowed)
	}
}

// add counts one request of cost at us (µs) under p: consumed, or refused by the policy.
func (s *needSeries) add(us int64, p *sluice.Policy, dryRun, aggregate bool, cost int64, consumed, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active.Load() < us {
		s.active.Store(us)
	}
	s.policy, s.dryRun, s.aggregate = *p, dryRun, aggregate
	if !s.open || us >= s.winEnd {
		// A new window (a request a moment late for the current one counts in it).
		s.closeWindow()
		_, s.winStart, s.winEnd = p.WindowOf(us)
		s.winUse, s.open = 0, true
	}
	if consumed {
		s.winUse += cost
	}
	sec := floorDiv(us, 1e6)
	minute := floorDiv(sec, 60)
	d := s.day(floorDiv(sec, 86400))
	if d == nil {
		return // more than needsDays late: not kept
	}
	pg := s.pages[minute%needsMinutes]
	if pg == nil {
		pg = &needPage{min: minute}
		s.pages[minute%needsMinutes] = pg
	} else if pg.min != minute {
		if minute < pg.min {
			return // a day late: not kept
		}
		*pg = needPage{min: minute}
	}
	d.offered++
	if r := &pg.reqs[sec-minute*60]; *r < 1<<16-1 {
		*r++
	}
	pg.units += cost
	if refused {
		d.refused++
		pg.refused++
	}
}

// closeWindow adds the open window's use to the day it ended on (none: nothing).
func (s *needSeries) closeWindow() {
	if !s.open || s.winUse <= 0 {
		return
	}
	d := s.day(floorDiv(s.winEnd-1, 86400e6))
	if d == nil {
		return
	}
	d.windows++
	d.peak = max(d.peak, s.winUse)
	d.hist[needBucket(s.winUse)]++
}

// day returns the record of unix day, started afresh if its slot held an older day; nil if the
// slot holds a later one (day is more than needsDays old).
func (s *needSeries) day(day int64) *needDay {
	d := &s.days[((day%needsDays)+needsDays)%needsDays]
	switch {
	case d.day > day:
		return nil
	case d.day != day:
		*d = needDay{day: day}
	}
	return d
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// needBucket is the histogram bucket of a window's use v: exact below 16, then 8 buckets per
// power of two (so a bucket's values are within 12.5% of each other); the last takes the rest.
func needBucket(v int64) int {
	if v < 16 {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - 1
	return min(16+(e-4)*8+int((v>>(e-3))&7), needsBuckets-1)
}

// needBucketTop is the largest use in bucket i.
func needBucketTop(i int) int64 {
	if i < 16 {
		return int64(i)
	}
	e, sub := (i-16)/8+4, (i-16)%8
	return int64(8+sub+1)<<(e-3) - 1
}

// NeedsReport is GET /v1/clients/{name}/needs: a client's use of each policy that applies to it.
type NeedsReport struct {
	Client   string `json:"client"`
	KeptDays int    `json:"kept_days"` // the days use is kept for
	// Time is the instant the report was made at; its days are the UTC days up to it.
	Time     time.Time     `json:"time"`
	Policies []PolicyNeeds `json:"policies"`
}

// PolicyNeeds is a client's use of one policy over the kept days.
type PolicyNeeds struct {
	Policy    string `json:"policy"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	// Window is what use is counted per: the policy's period (its fixed windows, or a bucket's
	// period), or its calendar window ("day", "week", "month", "year").
	Window   string  `json:"window"`
	WindowS  float64 `json:"window_s"` // the period in seconds; 0 for a calendar window
	DryRun   bool    `json:"dry_run,omitempty"`
	Recorded bool    `json:"recorded"` // any request of the client was decided under it (kept)
	// Aggregate: the policy counts under other keys than the client's own (the anonymous
	// clients, each by its address; key_by): its use here is their sum, which no one limit
	// applies to, so it has no flags and no what-if.
	Aggregate bool `json:"aggregate,omitempty"`
	// Over the kept days: the windows with use, the most one used, the 50th and 99th percentile
	// of their use (within 12.5%: a histogram's bucket, at most Peak), requests decided and those
	// the policy refused.
	Windows int64 `json:"windows"`
	Peak    int64 `json:"peak"`
	P50     int64 `json:"p50"`
	P99     int64 `json:"p99"`
	Offered int64 `json:"offered"`
	Refused int64 `json:"refused"`
	// Current is the use of the window running now (not in the figures above until it ends).
	Current int64       `json:"current"`
	Flags   []NeedsFlag `json:"flags"`
	Days    []NeedsDay  `json:"days"`  // the kept days with requests, oldest first
	Hours   []NeedsHour `json:"hours"` // the last 24 hours, oldest first (from the timeline)
}

// NeedsDay is one UTC day of a series.
type NeedsDay struct {
	Date    string `json:"date"` // 2006-01-02, UTC
	Windows int64  `json:"windows"`
	Peak    int64  `json:"peak"`
	P99     int64  `json:"p99"`
	Offered int64  `json:"offered"`
	Refused int64  `json:"refused"`
}

// NeedsHour is one hour of the last day's timeline.
type NeedsHour struct {
	Start   time.Time `json:"start"`
	Offered int64     `json:"offered"` // requests decided
	Units   int64     `json:"units"`   // their cost
	Refused int64     `json:"refused"`
}

// NeedsFlag says a limit does not fit the client's use.
type NeedsFlag struct {
	// Kind is far_above (the limit is more than ten times the 99th percentile of its use) or
	// too_low (refused while its median window uses at least 80% of the limit).
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// report summarises the series at now (µs).
func (s *needSeries) report(now int64) PolicyNeeds {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.describe(s.policy, s.dryRun)
	out.Recorded, out.Aggregate = true, s.aggregate
	if s.open && now < s.winEnd {
		out.Current = s.winUse
	}
	today := floorDiv(now, 86400e6)
	var hist [needsBuckets]uint32
	for day := today - needsDays + 1; day <= today; day++ {
		d := &s.days[((day%needsDays)+needsDays)%needsDays]
		if d.day != day || d.offered == 0 && d.windows == 0 {
			continue
		}
		out.Windows += d.windows
		out.Peak = max(out.Peak, d.peak)
		out.Offered += d.offered
		out.Refused += d.refused
		for i, n := range d.hist {
			hist[i] += n
		}
		out.Days = append(out.Days, NeedsDay{Date: time.Unix(day*86400, 0).UTC().Format(time.DateOnly), Windows: d.windows,
			Peak: d.peak, P99: quantile(&d.hist, d.windows, 0.99, d.peak), Offered: d.offered, Refused: d.refused})
	}
	out.P50 = quantile(&hist, out.Windows, 0.50, out.Peak)
	out.P99 = quantile(&hist, out.Windows, 0.99, out.Peak)
	nowMin := floorDiv(now, 60e6)
	first := (nowMin/60 - 23) * 60 // the first minute of the hour 23 hours ago
	out.Hours = make([]NeedsHour, 24)
	for i := range out.Hours {
		out.Hours[i].Start = time.Unix((first+int64(i)*60)*60, 0).UTC()
	}
	for _, pg := range s.pages {
		if pg == nil || pg.min < first || pg.min > nowMin {
			continue
		}
		h := &out.Hours[(pg.min-first)/60]
		for _, r := range pg.reqs {
			h.Offered += int64(r)
		}
		h.Units += pg.units
		h.Refused += int64(pg.refused)
	}
	if !s.aggregate {
		out.Flags = flags(out)
	}
	return out
}

// describe is a policy's fields of a PolicyNeeds, with no use.
func (s *needSeries) describe(p sluice.Policy, dryRun bool) PolicyNeeds {
	out := PolicyNeeds{Policy: s.name, Algorithm: p.Algorithm.String(), Limit: p.Limit, DryRun: dryRun,
		Window: windowName(p), Flags: []NeedsFlag{}, Days: []NeedsDay{}, Hours: []NeedsHour{}}
	if p.Calendar == sluice.NoCalendar {
		out.WindowS = p.Period.Seconds()
	}
	return out
}

// quantile is the q-quantile of n uses in hist: the top of the bucket that holds it, at most peak.
func quantile(hist *[needsBuckets]uint32, n int64, q float64, peak int64) int64 {
	if n == 0 {
		return 0
	}
	rank := int64(q*float64(n) + 0.999999)
	var seen int64
	for i, c := range hist {
		if seen += int64(c); seen >= rank {
			return min(needBucketTop(i), peak)
		}
	}
	return peak
}

// flags are what the use says of the limit (see NeedsFlag), once there are needsMinWindows
// windows with use:
//
//   - far_above: the 99th percentile of the use per window is under 10% of the limit;
//   - too_low: the policy refused requests, and the median window's use is at least 80% of the
//     limit — the refusals fall on the client's normal work, which runs near the limit all the
//     time, not on a runaway burst of a client that usually needs far less.
func flags(p PolicyNeeds) []NeedsFlag {
	out := []NeedsFlag{}
	if p.Windows < needsMinWindows || p.Limit <= 0 {
		return out
	}
	per := "/" + shortWindow(p.Window)
	if p.P99*10 < p.Limit {
		out = append(out, NeedsFlag{Kind: "far_above", Detail: fmt.Sprintf("limit %d%s, p99 use %d%s (peak %d%s) over %d windows",
			p.Limit, per, p.P99, per, p.Peak, per, p.Windows)})
	}
	if p.Refused > 0 && p.P50*5 >= p.Limit*4 {
		out = append(out, NeedsFlag{Kind: "too_low", Detail: fmt.Sprintf("limit %d%s, median use %d%s (p99 %d%s): %d requests refused while its use runs steadily near the limit",
			p.Limit, per, p.P50, per, p.P99, per, p.Refused)})
	}
	return out
}

// windowName names what a policy's use is counted per: its period, as a Go duration without
// its zero minutes and seconds ("1m", "1h", "1h30m", "1.5s"), or its calendar window ("day").
func windowName(p sluice.Policy) string {
	if p.Calendar != sluice.NoCalendar {
		return p.Calendar.String()
	}
	w := p.Period.String() // 1h0m0s, 1m0s, 1h30m0s, 1.5s, 90ms
	if t, ok := strings.CutSuffix(w, "m0s"); ok {
		w = t + "m"
	}
	if t, ok := strings.CutSuffix(w, "h0m"); ok {
		w = t + "h"
	}
	return w
}

// shortWindow writes a window name as a rate's unit: 1m as "min", 1s as "s", 1h as "h", 24h as
// "day"; any other as it is.
func shortWindow(w string) string {
	switch w {
	case "1s":
		return "s"
	case "1m":
		return "min"
	case "1h":
		return "h"
	case "24h":
		return "day"
	}
	return w
}

// report returns the client's report at now: every recorded series, then the policies
// configured for it (configured: those of its configuration, nil if none) it has not used.
func (n *needs) report(name string, configured []decision.Limit, now time.Time) NeedsReport {
	us := now.UnixMicro()
	r := NeedsReport{Client: name, KeptDays: needsDays, Time: now.UTC(), Policies: []PolicyNeeds{}}
	seen := map[string]bool{}
	if c := n.lookup(name); c != nil {
		for _, s := range c.all() {
			r.Policies = append(r.Policies, s.report(us))
			seen[s.name] = true
		}
	}
	for _, l := range configured {
		if seen[l.PolicyName] || l.Policy.Algorithm == sluice.Concurrency {
			continue
		}
		seen[l.PolicyName] = true
		s := needSeries{name: l.PolicyName}
		r.Policies = append(r.Policies, s.describe(l.Policy, l.DryRun))
	}
	sort.SliceStable(r.Policies, func(i, j int) bool { return r.Policies[i].Policy < r.Policies[j].Policy })
	return r
}
