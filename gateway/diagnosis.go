package gateway

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/internal/keyhash"
)

// The diagnosis (GET /v1/stats "diagnosis", the operator page): the usual mistakes of rate
// limiting, each found from the requests this instance decided, and what to do about it. All of
// it is bounded whatever clients send: the sketches hold hitterCounters keys each, the address
// table sharedMaxAddrs addresses of sharedMaxNames addresses behind each, and the usage rings one
// per configured client and policy.
const (
	hitterCounters = 64          // Space-Saving counters per sketch, shard and window (topKShards shards)
	hitterWindow   = time.Minute // a sketch's window; a report covers the last one to two
	hittersShown   = 10
	sharedMaxAddrs = 4096
	sharedMaxNames = 8
	sharedTTL      = 10 * time.Minute // an address's clients behind it are forgotten this long after its last request
	usageWindows   = 60               // the windows of each policy a suggested limit looks back over
	sharedShown    = 20               // addresses shared by clients, listed
	perKindShown   = 5                // findings of one kind
	heavyRefusals  = 10               // an anonymous address refused fewer times in the window is no finding
	earlyShown     = 3                // early retriers with a finding (of at least earlyAtLeast early retries)
	earlyAtLeast   = 3
)

type diagnosis struct {
	// Anonymous requests and refusals by address (their rate-limit key, "ip:…"), and by the
	// SHA-256 of an API key that matched no client.
	addrRequests, addrRefusals, keyRequests, keyRefusals *topK
	// Early retries by rate-limit key; sums: µs since the refusal, µs of its Retry-After.
	retriers *topK
	shared   *sharedAddrs                  // anonymous addresses, and whom their forwarding headers say they forward for
	usage    cowMap[[2]string, *usageRing] // configured client, policy
	shares   *Shares                       // this instance's approvals for the instance registry (shares.go); nil: none
}

func newDiagnosis() *diagnosis {
	t := func() *topK { return newTopK(hitterCounters, hitterWindow) }
	return &diagnosis{addrRequests: t(), addrRefusals: t(), keyRequests: t(), keyRefusals: t(), retriers: t(),
		shared: newSharedAddrs()}
}

// decided notes one decided request at now; if wasEarly, it came back early from the refusal
// early (earlyRetries.earlyBy).
func (d *diagnosis) decided(req *decision.Request, v *decision.Verdict, now time.Time, early refusal, wasEarly bool) {
	refused := v.Outcome == decision.Refused
	d.shares.record(req, v, now)
	if wasEarly {
		d.retriers.add(req.Who.Key, now, [2]int64{now.Sub(early.at).Microseconds(), early.until.Sub(early.at).Microseconds()})
	}
	if req.Who.Client == "" {
		d.addrRequests.add(req.Who.Key, now, [2]int64{})
		if refused {
			d.addrRefusals.add(req.Who.Key, now, [2]int64{})
		}
		if req.Seen.HasUnknownKey {
			k := hex.EncodeToString(req.Seen.UnknownKey[:])
			d.keyRequests.add(k, now, [2]int64{})
			if refused {
				d.keyRefusals.add(k, now, [2]int64{})
			}
		}
		// Only here: a client named by a key or a token is counted by its name, wherever it
		// comes from, and many of them behind one address are no mistake.
		if req.Seen.Addr.IsValid() && req.Seen.Behind.IsValid() {
			d.shared.record(req.Seen.Addr, req.Seen.Behind, refused, now)
		}
		return
	}
	passed := v.Passes()
	for i, a := range v.Decisions {
		if i >= len(req.Limits) || req.Limits[i].DryRun || req.Limits[i].KeyBy != nil || !windowed(a.Policy) {
			continue // (a policy with key_by counts per tuple, not per client: its usage is not the client's)
		}
		cost := req.LimitCost(i)
		u := d.usage.get([2]string{req.Who.Client, req.Limits[i].PolicyName}, func() *usageRing { return &usageRing{} })
		u.record(a.Policy, now, cost, passed && a.Decision.Allowed, !a.Decision.Allowed, wasEarly)
	}
}

// windowed reports whether p is a rate over a fixed period, whose per-period usage a suggested
// limit can be read from: not a concurrency limit, not a calendar window (months differ).
func windowed(p sluice.Policy) bool {
	return p.Algorithm != algorithm.Concurrency && p.Calendar == algorithm.NoCalendar && p.Period > 0
}

// sharedAddrs is, per anonymous network address that is not a trusted proxy, the addresses its
// forwarding header said it forwards for lately: sharded by address (so that requests seldom
// wait on one lock), sharedMaxAddrs in all.
type sharedAddrs struct {
	hash   keyhash.Hasher
	shards [sharedShards]addrShard
}

const sharedShards = 16

type addrShard struct {
	mu        sync.Mutex
	m         map[netip.Addr]*addrClients // guarded by mu; at most sharedMaxAddrs/sharedShards
	lastSweep time.Time
}

func newSharedAddrs() *sharedAddrs {
	s := &sharedAddrs{hash: keyhash.New()}
	for i := range s.shards {
		s.shards[i].m = map[netip.Addr]*addrClients{}
	}
	return s
}

func (s *sharedAddrs) record(addr, behind netip.Addr, refused bool, now time.Time) {
	a := addr.As16()
	s.shards[s.hash.Bytes(a[:])%sharedShards].record(addr, behind, refused, now)
}

func (s *sharedAddrs) shared(now time.Time) []SharedAddress {
	var out []SharedAddress
	for i := range s.shards {
		out = append(out, s.shards[i].shared(now)...)
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i].Clients) != len(out[j].Clients) {
			return len(out[i].Clients) > len(out[j].Clients)
		}
		return out[i].Address < out[j].Address
	})
	return out
}

// size is the addresses held, for the test of the bound.
func (s *sharedAddrs) size() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].m)
		s.shards[i].mu.Unlock()
	}
	return n
}

type addrClients struct {
	last    time.Time
	behind  [sharedMaxNames]netip.Addr
	refused [sharedMaxNames]bool
	n       int
	more    bool // more addresses behind it than sharedMaxNames were seen
}

func (s *addrShard) record(addr, behind netip.Addr, refused bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m[addr]
	if a == nil {
		if len(s.m) >= sharedMaxAddrs/sharedShards {
			if now.Sub(s.lastSweep) < time.Second { // a full table is swept at most once a second
				return
			}
			s.lastSweep = now
			for k, v := range s.m {
				if now.Sub(v.last) > sharedTTL {
					delete(s.m, k)
				}
			}
			if len(s.m) >= sharedMaxAddrs/sharedShards {
				return
			}
		}
		a = &addrClients{}
		s.m[addr] = a
	}
	a.last = now
	for i := 0; i < a.n; i++ {
		if a.behind[i] == behind {
			a.refused[i] = a.refused[i] || refused
			return
		}
	}
	if a.n == sharedMaxNames {
		a.more = true
		return
	}
	a.behind[a.n], a.refused[a.n] = behind, refused
	a.n++
}

// SharedAddress is a network address that several anonymous clients came through, all counted
// as it: a proxy or gateway that is not among the ip source's trusted proxies.
type SharedAddress struct {
	Address string   `json:"address"`
	Clients []string `json:"clients"` // the addresses its forwarding header said it forwards for
	Refused []string `json:"refused"` // those of them refused lately
	More    bool     `json:"more,omitempty"`
}

func (s *addrShard) shared(now time.Time) []SharedAddress {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SharedAddress
	for addr, a := range s.m {
		if a.n < 2 || now.Sub(a.last) > sharedTTL {
			continue
		}
		behind := slices.Clone(a.behind[:a.n])
		slices.SortFunc(behind, netip.Addr.Compare)
		sa := SharedAddress{Address: addr.String(), Clients: []string{}, Refused: []string{}, More: a.more}
		for _, b := range behind {
			sa.Clients = append(sa.Clients, b.String())
			if a.refused[slices.Index(a.behind[:a.n], b)] {
				sa.Refused = append(sa.Refused, b.String())
			}
		}
		out = append(out, sa)
	}
	return out
}

// usageRing is one configured client's use of one policy, per window of the policy's period
// (aligned to the epoch), over the last usageWindows windows.
type usageRing struct {
	mu     sync.Mutex
	policy sluice.Policy // as last decided (a reload may change it)
	win    [usageWindows]usageWindow
}

type usageWindow struct {
	n                       int64 // the window's number: unix µs / period; 0 unused
	allowed, refused, early int64 // cost allowed, cost refused, early retries
}

func (u *usageRing) record(p sluice.Policy, now time.Time, cost int64, allowed, refused, early bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if p != u.policy {
		u.policy, u.win = p, [usageWindows]usageWindow{} // another limit: its usage starts again
	}
	n := now.UnixMicro() / p.Period.Microseconds()
	w := &u.win[n%usageWindows]
	if w.n != n {
		*w = usageWindow{n: n}
	}
	switch {
	case allowed:
		w.allowed += cost
	case refused:
		w.refused += cost
	}
	if early {
		w.early++
	}
}

// LowLimit is a configured client refused at its limit though it waits its Retry-After: its
// normal work needs more than the limit allows.
type LowLimit struct {
	Client string `json:"client"`
	Policy string `json:"policy"`
	Limit  int64  `json:"limit"`
	Period string `json:"period"`
	// Over the last Windows windows of the policy's period: what it was refused, the most it
	// was allowed in one window (at its limit), and the most it asked for in one (allowed and
	// refused; a refused request it sent again later counts again, so this is an upper estimate).
	Windows     int   `json:"windows"`
	Active      int   `json:"active_windows"` // those it sent requests in
	Refused     int64 `json:"refused"`
	PeakAllowed int64 `json:"peak_allowed"`
	PeakDemand  int64 `json:"peak_demand"`
	P95Demand   int64 `json:"p95_demand"` // over the active windows
	// SuggestedLimit is P95Demand (at least the limit + 1) rounded up to two significant digits.
	SuggestedLimit int64 `json:"suggested_limit"`
}

// low returns the ring's finding at now, if it has one: refused within the windows, no early
// retry in them, and at its peak allowed at least 90% of the limit.
func (u *usageRing) low(client, policy string, now time.Time) (LowLimit, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := u.policy
	if p.Period <= 0 {
		return LowLimit{}, false
	}
	cur := now.UnixMicro() / p.Period.Microseconds()
	l := LowLimit{Client: client, Policy: policy, Limit: p.Limit, Period: p.Period.String(), Windows: usageWindows}
	var early int64
	var demand [usageWindows]int64
	for _, w := range u.win {
		if w.n == 0 || w.n <= cur-usageWindows || w.n > cur || w.allowed+w.refused == 0 {
			continue
		}
		l.Refused += w.refused
		early += w.early
		l.PeakAllowed = max(l.PeakAllowed, w.allowed)
		demand[l.Active] = w.allowed + w.refused
		l.Active++
	}
	if l.Refused == 0 || early > 0 || l.PeakAllowed*10 < p.Limit*9 {
		return LowLimit{}, false
	}
	d := demand[:l.Active]
	slices.Sort(d)
	l.PeakDemand = d[len(d)-1]
	l.P95Demand = d[(len(d)*95+99)/100-1] // the nearest rank
	l.SuggestedLimit = roundUp2(max(l.P95Demand, p.Limit+1))
	return l, true
}

// roundUp2 rounds n up to two significant digits: 6, 47, 140, 1300.
func roundUp2(n int64) int64 {
	unit := int64(1)
	for n/unit >= 100 {
		unit *= 10
	}
	return (n + unit - 1) / unit * unit
}

// Retrier is a client that comes back before its Retry-After runs out.
type Retrier struct {
	Key   string `json:"key"` // the rate-limit key: a configured client's name, or "ip:…"
	Count uint64 `json:"early_retries"`
	Error uint64 `json:"error"`
	// Means over the early retries seen since it entered the sketch: how long after its
	// refusal it came back, and the Retry-After that refusal gave.
	AfterMs      float64 `json:"mean_retry_after_refusal_ms"`
	RetryAfterMs float64 `json:"mean_retry_after_given_ms"`
}

// Diagnosis is GET /v1/stats "diagnosis": what looks wrong, and the evidence.
type Diagnosis struct {
	Findings []Finding `json:"findings"` // each with what to do, at most perKindShown of a kind
	// The sketches' window and counters: each count over-estimates by at most its error, which
	// is at most the sketch's total over CountersPerShard; every key over that is held.
	WindowSeconds    int `json:"window_s"`
	Counters         int `json:"counters"` // per sketch: shards × counters per shard
	CountersPerShard int `json:"counters_per_shard"`
	// Anonymous clients (all labelled "anonymous" in the metrics): by address, and by the
	// SHA-256 of an API key that matched no client; each by requests and by refusals.
	Addresses     Hitters         `json:"addresses"`
	UnknownKeys   Hitters         `json:"unknown_api_keys"`
	SharedAddress []SharedAddress `json:"shared_addresses"` // the most shared, at most sharedShown
	LimitTooLow   []LowLimit      `json:"limit_too_low"`
	EarlyRetriers []Retrier       `json:"early_retriers"`
	Counting      Counting        `json:"counting"`
	// Shares is each live instance's approvals of each client, from the instance registry
	// (shares.go); absent with the memory store.
	Shares *SharesStats `json:"shares,omitempty"`
}

// Hitters are the heaviest keys of two sketches, and the totals they counted.
type Hitters struct {
	Requests      []Hitter `json:"by_requests"`
	Refusals      []Hitter `json:"by_refusals"`
	TotalRequests uint64   `json:"total_requests"`
	TotalRefusals uint64   `json:"total_refusals"`
}

// Counting is whether the instances behind one configuration count together.
type Counting struct {
	Store string `json:"store"`
	// Shared: the counters are in a store every instance reaches (Redis); with the memory store
	// each instance counts alone.
	Shared bool `json:"shared"`
	// Instances is the live count in the instance registry (every Redis store runs one), 0
	// before a heartbeat reached Redis. The memory store cannot see other instances.
	Instances int `json:"instances"`
}

// Finding is one diagnosed mistake.
type Finding struct {
	Kind    string `json:"kind"`    // heavy_hitter, unknown_api_key, shared_address, limit_too_low, early_retries, separate_counters, region_safe_share, global_limit_short, region_refresh_slow, rlqs_demand_over_limit, rlqs_ledger_unreachable
	Subject string `json:"subject"` // what it is about: an address, a key hash, a client
	Summary string `json:"summary"`
	Do      string `json:"do"` // what to do about it
}

func hitters(req, ref *topK, now time.Time) Hitters {
	var h Hitters
	h.Requests, h.TotalRequests = req.top(now, hittersShown)
	h.Refusals, h.TotalRefusals = ref.top(now, hittersShown)
	return h
}

// snapshot returns the diagnosis at now; fleet is the instance registry's (nil: none).
func (d *diagnosis) snapshot(now time.Time, cfg *config.Config, fleet *FleetStats) Diagnosis {
	out := Diagnosis{WindowSeconds: int(hitterWindow / time.Second), Counters: hitterCounters * topKShards, CountersPerShard: hitterCounters,
		Addresses: hitters(d.addrRequests, d.addrRefusals, now), UnknownKeys: hitters(d.keyRequests, d.keyRefusals, now),
		SharedAddress: d.shared.shared(now), LimitTooLow: []LowLimit{}, EarlyRetriers: []Retrier{}, Findings: []Finding{}}
	if out.SharedAddress == nil {
		out.SharedAddress = []SharedAddress{}
	}
	out.SharedAddress = out.SharedAddress[:min(sharedShown, len(out.SharedAddress))]
	kinds := map[string]int{}
	add := func(f Finding) {
		if kinds[f.Kind] < perKindShown {
			kinds[f.Kind]++
			out.Findings = append(out.Findings, f)
		}
	}
	// Separate counters first: it multiplies every limit.
	out.Counting = Counting{Store: cfg.Store.Type, Shared: cfg.Store.Type == config.StoreRedis}
	if fleet != nil {
		out.Counting.Instances = fleet.Instances
		var found []Finding
		out.Shares, found = fleetShares(fleet, fleetMaxCounts)
		for _, f := range found {
			add(f)
		}
	}
	if !out.Counting.Shared {
		add(Finding{Kind: "separate_counters", Subject: "store: memory",
			Summary: "this instance counts alone (memory store): if several instances run behind one load balancer with this configuration, each lets the whole limit through, and a client gets as many limits as there are instances; the memory store cannot see the others",
			Do:      "run one instance, or give every instance the same store: redis"})
	}
	for _, sa := range out.SharedAddress {
		add(Finding{Kind: "shared_address", Subject: sa.Address,
			Summary: fmt.Sprintf("%s%d anonymous clients come through %s, all counted as it, one quota for all (it is not a trusted proxy): its forwarding header says it forwards for %s%s",
				atLeast(sa.More), len(sa.Clients), sa.Address, strings.Join(sa.Clients, ", "), refusedNote(sa.Refused)),
			Do: fmt.Sprintf("if %s is your proxy or load balancer, add it to the ip source's trusted_proxies (and name the header it writes in forwarded_header), so that each client is counted by its own address; if they are partners, give them API keys", sa.Address)})
	}
	for key, u := range d.usage.all() {
		if l, ok := u.low(key[0], key[1], now); ok {
			out.LimitTooLow = append(out.LimitTooLow, l)
		}
	}
	sort.Slice(out.LimitTooLow, func(i, j int) bool {
		a, b := out.LimitTooLow[i], out.LimitTooLow[j]
		if a.Refused != b.Refused {
			return a.Refused > b.Refused
		}
		return a.Client+"/"+a.Policy < b.Client+"/"+b.Policy
	})
	for _, l := range out.LimitTooLow {
		add(Finding{Kind: "limit_too_low", Subject: l.Client,
			Summary: fmt.Sprintf("%s is refused by %s (%d per %s) though it waits its Retry-After: %d refused in the last %d windows, at most %d allowed in one, and %d asked for in 95%% of the %d it was active in (%d at most)",
				l.Client, l.Policy, l.Limit, l.Period, l.Refused, l.Windows, l.PeakAllowed, l.P95Demand, l.Active, l.PeakDemand),
			Do: fmt.Sprintf("if this is its normal work, raise its limit to about %d per %s (a policy of its own, or an override); if not, ask it to spread its requests", l.SuggestedLimit, l.Period)})
	}
	for _, h := range out.Addresses.Refusals {
		if h.Count < heavyRefusals {
			break
		}
		add(Finding{Kind: "heavy_hitter", Subject: h.Key,
			Summary: fmt.Sprintf("anonymous %s was refused %d times in the last %d–%d s (±%d)", h.Key, h.Count, out.WindowSeconds, 2*out.WindowSeconds, h.Error),
			Do:      "if it is abuse, block the address before sluice; if it is a partner, give it an API key, so that it has a limit of its own and a name in the metrics"})
	}
	for _, h := range out.UnknownKeys.Refusals {
		add(Finding{Kind: "unknown_api_key", Subject: h.Key,
			Summary: fmt.Sprintf("an API key of SHA-256 %s… matches no client and was refused %d times (±%d)", h.Key[:16], h.Count, h.Error),
			Do:      "if a partner's key: add this api_key_sha256 to its client (a rotated key?); if not, the key is guessed or stolen"})
	}
	rs, _ := d.retriers.top(now, hittersShown)
	for _, h := range rs {
		r := Retrier{Key: h.Key, Count: h.Count, Error: h.Error}
		if h.seen > 0 {
			r.AfterMs = float64(h.sums[0]) / float64(h.seen) / 1000
			r.RetryAfterMs = float64(h.sums[1]) / float64(h.seen) / 1000
		}
		out.EarlyRetriers = append(out.EarlyRetriers, r)
	}
	for _, r := range out.EarlyRetriers[:min(earlyShown, len(out.EarlyRetriers))] {
		if r.Count < earlyAtLeast {
			break
		}
		add(Finding{Kind: "early_retries", Subject: r.Key,
			Summary: fmt.Sprintf("%s came back %d times before its Retry-After ran out: on average %v after its refusal, when told to wait %v", r.Key, r.Count, msDuration(r.AfterMs), msDuration(r.RetryAfterMs)),
			Do:      "ask its owner to wait the Retry-After (or the RateLimit reset) before retrying, with backoff and jitter; its early retries are refused and only add load"})
	}
	return out
}

// atLeast is the note of a list cut at its bound.
func atLeast(more bool) string {
	if more {
		return "at least "
	}
	return ""
}

func refusedNote(refused []string) string {
	if len(refused) == 0 {
		return ""
	}
	return "; refused lately: " + strings.Join(refused, ", ")
}

// msDuration is ms milliseconds as a duration to read: to the second from a minute up, to the
// millisecond below, or the 0.1 ms below one.
func msDuration(ms float64) time.Duration {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d < time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d < time.Minute:
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
