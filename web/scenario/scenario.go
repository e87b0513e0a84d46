// Package scenario is the model of the browser simulation: a scenario (traffic, optional jitter,
// and a policy for each of the five algorithms) as it travels in the page's URL, and its run on
// sim's virtual clock, cut into time buckets for the plots.
//
// It decides nothing itself: every request goes through a sim.Session, the code path of
// `sluice simulate`, so a scenario without per-algorithm changes and without jitter gives, to
// the number, the summaries of
//
//	sluice simulate --compare --limit L --period P --burst B --traffic PATTERN --format json
//
// This package is plain Go, compiled both natively (tests) and to WebAssembly (web/wasm).
package scenario

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/sim"
)

// MaxRequests bounds the requests of one scenario. The page runs all five algorithms on the
// browser's main thread whenever an input changes, so it takes fewer than `sluice simulate`
// (sim.MaxRequests): a larger scenario is an error that says to use the command line.
const MaxRequests = 200_000

// Scenario is what the page simulates: one traffic, and the policy each algorithm applies to it.
// The zero value is not a valid scenario; Parse returns valid ones.
type Scenario struct {
	Traffic string        // a sim.ParseClientTraffic pattern, normalised: "5/s for 10s; 40 in 1s", "buggy: 600/min for 1m; normal: 20/min for 1m"
	Jitter  time.Duration // each request arrives up to Jitter later than the pattern says; 0: none
	Draw    uint64        // the number the jitter, real costs and a random balancer are drawn from, so that a run is reproducible

	// The shared policy, as `sluice simulate --compare` takes it: Burst goes to the token bucket
	// (its capacity; 0 means Limit) and the leaky bucket (its queue room) only.
	Limit  int64
	Period time.Duration
	Burst  int64

	// Own holds per-algorithm changes to the shared policy, in the order of
	// algorithm.Algorithms; the zero Override changes nothing.
	Own [5]Override

	// Calendar, if set, replaces Period: fixed-window and sliding-window count by calendar
	// windows in Location (nil: UTC), as `sluice simulate --compare --calendar` does, and the
	// other three algorithms, which have no calendar, do not run. Burst is then 0.
	Calendar sluice.Calendar
	Location *time.Location
	// Start is the instant the virtual clock's 0 stands for (sim.Options.Start); the zero Time
	// is Unix time 0. With a calendar it defaults to DefaultStart's local midnight.
	Start time.Time

	// Actual, if set, gives every request a real cost, settled after its decision.
	Actual Actual

	// Instances, if > 1, runs every algorithm on that many instances behind a load balancer
	// (Balance: round robin, or at random from Draw), each with its own memory store (Stores
	// SeparateStores) or all on one (SharedStore), as `sluice simulate --instances --store` does
	// (fleet.go). 0: one instance. With a shared store, StoreLatency is each call's round trip to
	// it, and Outage (nil: none) a window in which it fails, each instance then answering with
	// Outage.OnError.
	Instances    int
	Stores       sim.StoreMode
	Balance      sim.Balance
	StoreLatency time.Duration
	Outage       *sim.Outage

	// Changes change the limit or the burst of every algorithm at instants of virtual time
	// (the live mode's), as `sluice simulate --change` does; one instance only.
	Changes []sim.Change
}

// Override changes some numbers of the shared policy for one algorithm.
type Override struct {
	Limit    int64         // 0: the shared limit
	Period   time.Duration // 0: the shared period
	Burst    int64         // applies only if OwnBurst (0 is a burst too)
	OwnBurst bool          // Burst replaces the shared burst (token-bucket and leaky-bucket only)
}

func (o Override) zero() bool { return o == Override{} }

// Policies returns the policy of each algorithm that runs, in the order of algorithm.Algorithms:
// all five, or with a calendar fixed-window and sliding-window.
func (sc *Scenario) Policies() []sluice.Policy {
	if sc.Calendar != sluice.NoCalendar {
		return sc.calendarPolicies()
	}
	ps := sim.ComparePolicies(sc.Limit, sc.Period, sc.Burst)
	for i := range ps {
		o := sc.Own[i]
		if o.Limit != 0 {
			ps[i].Limit = o.Limit
		}
		if o.Period != 0 {
			ps[i].Period = o.Period
		}
		if o.OwnBurst {
			ps[i].Burst = o.Burst
		}
	}
	return ps
}

// IsCompare reports whether every algorithm runs the shared policy, as
// `sluice simulate --compare` does.
func (sc *Scenario) IsCompare() bool {
	for _, o := range sc.Own {
		if !o.zero() {
			return false
		}
	}
	return true
}

// FieldError is what is wrong with one input of the page, named as in the query string
// ("limit", "token-bucket.burst", "traffic"); Field is empty for the query as a whole.
type FieldError struct {
	Field   string
	Message string // a sentence without the field's name: "must be a whole number > 0"
}

// Errors lists what is wrong with a scenario, at most one error per field.
type Errors []FieldError

func (e Errors) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		if fe.Field == "" {
			parts[i] = fe.Message
		} else {
			parts[i] = fe.Field + ": " + fe.Message
		}
	}
	return strings.Join(parts, "; ")
}

// The query string's keys. Per algorithm, "<algorithm>.limit", "<algorithm>.period" and
// "<algorithm>.burst" (the burst for the two buckets only), e.g. "token-bucket.burst=20".
const (
	KeyTraffic = "traffic"
	KeyJitter  = "jitter"
	KeyDraw    = "draw"
	KeyLimit   = "limit"
	KeyPeriod  = "period"
	KeyBurst   = "burst"
	KeyChange  = "change" // repeated: "change=t%3D30s%2Climit%3D20"
	// and KeyCalendar, KeyTimeZone, KeyStart, KeyActual (calendar.go), KeyInstances, KeyStore,
	// KeyBalance, KeyStoreLatency, KeyOutage, KeyOnError (fleet.go)
)

// Parse reads a scenario from a URL query string (with or without its leading "?"). A query that
// names none of the scenario's keys gives the first preset, so that the page's bare address
// shows something. Keys that are not the scenario's (as a link's tracking parameters) are
// ignored. Every error is returned, one per field.
func Parse(query string) (Scenario, Errors) {
	// A pattern's ";" typed into the address bar arrives unescaped; this query has no other use
	// for it (url.ParseQuery rejects it as a separator).
	values, err := url.ParseQuery(strings.ReplaceAll(strings.TrimPrefix(query, "?"), ";", "%3B"))
	if err != nil {
		return Scenario{}, Errors{{"", fmt.Sprintf("the address's query string is malformed: %v", err)}}
	}
	if !mentionsScenario(values) {
		sc, errs := Parse(Presets[0].Query)
		if errs != nil {
			panic("scenario: the first preset does not parse: " + errs.Error()) // a test keeps this from happening
		}
		return sc, nil
	}
	var sc Scenario
	var errs Errors
	fail := func(field, format string, args ...any) {
		errs = append(errs, FieldError{field, fmt.Sprintf(format, args...)})
	}
	get := func(key string) (string, bool) {
		v, ok := values[key]
		if !ok || len(v) == 0 {
			return "", false
		}
		return strings.TrimSpace(v[0]), true
	}

	if text, ok := get(KeyTraffic); !ok || text == "" {
		fail(KeyTraffic, "is required: a pattern such as \"5/s for 10s; 40 in 1s; 5/s for 10s\"")
	} else if sc.Traffic = sim.NormalizePattern(text); sc.Traffic == "" {
		// Only separators (";"): no segment at all, which would encode as no traffic.
		fail(KeyTraffic, "has no segments: want a pattern such as \"5/s for 10s; 40 in 1s; 5/s for 10s\"")
	}
	if text, ok := get(KeyJitter); ok && text != "" {
		d, msg := parseDuration(text, 0)
		if msg != "" {
			fail(KeyJitter, "%s", msg)
		}
		sc.Jitter = d
	}
	sc.Draw = 1
	if text, ok := get(KeyDraw); ok && text != "" {
		n, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			fail(KeyDraw, "%q is not a whole number from 0 to 18446744073709551615", text)
		}
		sc.Draw = n
	}

	// The shared policy: each number is required, as the command line requires it.
	if text, ok := get(KeyLimit); !ok || text == "" {
		fail(KeyLimit, "is required: the requests allowed per period")
	} else if n, msg := parseCount(text, 1); msg != "" {
		fail(KeyLimit, "%s", msg)
	} else {
		sc.Limit = n
	}
	calendar := parseCalendarKeys(&sc, get, fail)
	if text, ok := get(KeyActual); ok && text != "" {
		a, msg := parseActual(text)
		if msg != "" {
			fail(KeyActual, "%s", msg)
		}
		sc.Actual = a
	}
	if text, ok := get(KeyPeriod); calendar {
		if ok && text != "" {
			fail(KeyPeriod, "and a calendar exclude each other: a calendar window's length is the calendar's")
		}
	} else if !ok || text == "" {
		fail(KeyPeriod, "is required: a duration such as 1s, 500ms or 1m (or a calendar)")
	} else if d, msg := parseDuration(text, algorithm.MinPeriod); msg != "" {
		fail(KeyPeriod, "%s", msg)
	} else {
		sc.Period = d
	}
	if text, ok := get(KeyBurst); ok && text != "" {
		n, msg := parseCount(text, 0)
		switch {
		case msg != "":
			fail(KeyBurst, "%s", msg)
		case calendar && n != 0:
			fail(KeyBurst, "%d: with a calendar, fixed-window and sliding-window run, which take no burst", n)
		}
		sc.Burst = n
	}

	for i, a := range algorithm.Algorithms {
		o := &sc.Own[i]
		key := func(k string) string { return a.String() + "." + k }
		if calendar && !hasCalendar(a) {
			for _, k := range []string{KeyLimit, KeyPeriod, KeyBurst} {
				if text, ok := get(key(k)); ok && text != "" {
					fail(key(k), "%v has no calendar: with one, only fixed-window and sliding-window run", a)
				}
			}
			continue
		}
		if text, ok := get(key(KeyPeriod)); calendar && ok && text != "" {
			fail(key(KeyPeriod), "and a calendar exclude each other: a calendar window's length is the calendar's")
			continue
		}
		if text, ok := get(key(KeyLimit)); ok && text != "" {
			n, msg := parseCount(text, 1)
			if msg != "" {
				fail(key(KeyLimit), "%s", msg)
			}
			o.Limit = n
		}
		if text, ok := get(key(KeyPeriod)); ok && text != "" {
			d, msg := parseDuration(text, algorithm.MinPeriod)
			if msg != "" {
				fail(key(KeyPeriod), "%s", msg)
			}
			o.Period = d
		}
		if text, ok := get(key(KeyBurst)); ok && text != "" {
			switch n, msg := parseCount(text, 0); {
			case !sim.TakesBurst(a):
				fail(key(KeyBurst), "%v takes no burst (only token-bucket and leaky-bucket do)", a)
			case msg != "":
				fail(key(KeyBurst), "%s", msg)
			default:
				o.Burst, o.OwnBurst = n, true
			}
		}
	}
	parseFleetKeys(&sc, get, fail)
	for _, text := range values[KeyChange] {
		c, err := sim.ParseChange(strings.TrimSpace(text))
		if err == nil && len(sc.Changes) > 0 && c.TMicros < sc.Changes[len(sc.Changes)-1].TMicros {
			err = fmt.Errorf("%s is before the change above it (list them in time order)", c)
		}
		if err != nil {
			fail(KeyChange, "%v", err)
			break
		}
		sc.Changes = append(sc.Changes, c)
	}
	if sc.Changes != nil && sc.Instances > 1 {
		fail(KeyChange, "applies to one instance: not with instances")
	}
	if errs != nil {
		return sc, errs
	}

	// What the fields cannot say alone (a burst that takes centuries to drain), named after the
	// field that made the policy so.
	for _, p := range sc.Policies() {
		p.Name = p.Algorithm.String()
		if err := p.Validate(); err != nil {
			field := KeyBurst
			if sc.Own[algorithmIndex(p.Algorithm)].OwnBurst {
				field = p.Algorithm.String() + "." + KeyBurst
			}
			fail(field, "%s", strings.TrimPrefix(err.Error(), algorithm.ErrInvalidPolicy.Error()+": "))
		}
		for _, c := range sc.Changes {
			if p = c.Apply(p); p.Validate() != nil {
				fail(KeyChange, "%s: %v: %v", c, p.Algorithm, p.Validate())
				return sc, errs
			}
		}
	}
	return sc, errs
}

func mentionsScenario(values url.Values) bool {
	for k := range values {
		switch k {
		case KeyTraffic, KeyChange, KeyJitter, KeyDraw, KeyLimit, KeyPeriod, KeyBurst, KeyCalendar, KeyTimeZone, KeyStart, KeyActual, KeyInstances, KeyStore,
			KeyBalance, KeyStoreLatency, KeyOutage, KeyOnError:
			return true
		}
		if name, _, ok := strings.Cut(k, "."); ok {
			if _, err := algorithm.ParseAlgorithm(name); err == nil {
				return true
			}
		}
	}
	return false
}

// parseCount parses a whole number from min to algorithm.MaxLimit; the message is "" if it is one.
func parseCount(text string, min int64) (int64, string) {
	n, err := strconv.ParseInt(text, 10, 64)
	switch {
	case err != nil && strings.Trim(text, "0123456789") == "":
		return 0, fmt.Sprintf("%s must be ≤ 2^53 (%d)", text, int64(algorithm.MaxLimit))
	case err != nil:
		return 0, fmt.Sprintf("%q is not a whole number", text)
	case n < min:
		return 0, fmt.Sprintf("%d must be ≥ %d", n, min)
	case n > algorithm.MaxLimit:
		return 0, fmt.Sprintf("%d must be ≤ 2^53 (%d)", n, int64(algorithm.MaxLimit))
	}
	return n, ""
}

// parseDuration parses a Go duration of whole µs, at least min; the message is "" if it is one.
func parseDuration(text string, min time.Duration) (time.Duration, string) {
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		return 0, fmt.Sprintf("%q is not a duration (want e.g. 1s, 500ms, 1m30s)", text)
	case d < min || d < 0:
		if min == 0 {
			return 0, fmt.Sprintf("%s must be ≥ 0", text)
		}
		return 0, fmt.Sprintf("%s must be ≥ %v", text, min)
	case d%time.Microsecond != 0:
		return 0, fmt.Sprintf("%s must be a whole number of microseconds", text)
	case d > sim.MaxTimeMicros*time.Microsecond:
		return 0, fmt.Sprintf("%s is longer than the simulator's clock runs (2^53 µs)", text)
	}
	return d, ""
}

// Encode writes sc as a query string (without "?"), its keys in a fixed order and its numbers in
// their shortest form, so that equal scenarios have equal addresses. Parse(sc.Encode()) == sc.
func (sc *Scenario) Encode() string {
	var b strings.Builder
	put := func(key, value string) {
		if b.Len() > 0 {
			b.WriteByte('&')
		}
		b.WriteString(key)
		b.WriteByte('=')
		// "/" and ":" need no escape in a query, and read better unescaped ("5/s", "00:00").
		b.WriteString(strings.NewReplacer("%2F", "/", "%3A", ":").Replace(url.QueryEscape(value)))
	}
	put(KeyTraffic, sc.Traffic)
	put(KeyLimit, strconv.FormatInt(sc.Limit, 10))
	if sc.Calendar != sluice.NoCalendar {
		put(KeyCalendar, sc.Calendar.String())
		if sc.Location != nil {
			put(KeyTimeZone, sc.Location.String())
		}
	} else {
		put(KeyPeriod, formatDuration(sc.Period))
		put(KeyBurst, strconv.FormatInt(sc.Burst, 10))
	}
	if !sc.Start.IsZero() {
		put(KeyStart, formatStart(sc.Start))
	}
	if sc.Actual.Set {
		put(KeyActual, sc.Actual.String())
	}
	if sc.Jitter > 0 {
		put(KeyJitter, formatDuration(sc.Jitter))
	}
	if sc.Jitter > 0 || sc.Actual.Min != sc.Actual.Max || sc.Balance == sim.Random {
		put(KeyDraw, strconv.FormatUint(sc.Draw, 10))
	}
	if sc.Instances > 1 {
		put(KeyInstances, strconv.Itoa(sc.Instances))
		put(KeyStore, sc.Stores.String())
		encodeFleet(sc, put)
	}
	for _, c := range sc.Changes {
		put(KeyChange, c.String())
	}
	for i, a := range algorithm.Algorithms {
		o := sc.Own[i]
		if o.Limit != 0 {
			put(a.String()+"."+KeyLimit, strconv.FormatInt(o.Limit, 10))
		}
		if o.Period != 0 {
			put(a.String()+"."+KeyPeriod, formatDuration(o.Period))
		}
		if o.OwnBurst {
			put(a.String()+"."+KeyBurst, strconv.FormatInt(o.Burst, 10))
		}
	}
	return b.String()
}

func formatDuration(d time.Duration) string { return sim.FormatDuration(int64(d / time.Microsecond)) }

// jitterStream is the PCG stream of the jitter (the text "sluice" as a number): with Draw,
// it fixes every offset.
const jitterStream = 0x736c75696365

// Requests returns the scenario's requests: the pattern's, each moved later by its jitter if
// any. The i-th request's offset is floor(x_i · Jitter / 2^64) µs for the i-th output x_i of
// math/rand/v2's PCG started from (Draw, 0x736c75696365); the requests are then put back in time order
// (a stable sort, so the same draw always gives the same order). Errors name the field at fault.
func (sc *Scenario) Requests() ([]sim.Request, Errors) {
	reqs, err := sim.ParseClientTraffic(sc.Traffic)
	switch {
	case err != nil:
		return nil, Errors{{KeyTraffic, err.Error()}}
	case len(clientsOf(reqs)) > MaxClients:
		return nil, Errors{{KeyTraffic, fmt.Sprintf("names %d clients; the page shows at most %d (use sluice simulate, which takes any number)", len(clientsOf(reqs)), MaxClients)}}
	case len(reqs) == 0:
		return nil, Errors{{KeyTraffic, fmt.Sprintf("%q makes no requests", sc.Traffic)}}
	case len(reqs) > MaxRequests:
		return nil, Errors{{KeyTraffic, fmt.Sprintf("makes %d requests; the page takes at most %d (use sluice simulate, which takes %d)", len(reqs), MaxRequests, sim.MaxRequests)}}
	}
	if sc.Jitter <= 0 {
		return reqs, nil
	}
	jitter := uint64(sc.Jitter / time.Microsecond)
	rng := rand.NewPCG(sc.Draw, jitterStream)
	for i := range reqs {
		offset, _ := bits.Mul64(rng.Uint64(), jitter)
		reqs[i].TMicros += int64(offset)
		if reqs[i].TMicros > sim.MaxTimeMicros {
			return nil, Errors{{KeyJitter, "moves requests past the end of the simulator's clock (2^53 µs)"}}
		}
	}
	slices.SortStableFunc(reqs, func(a, b sim.Request) int {
		switch {
		case a.TMicros < b.TMicros:
			return -1
		case a.TMicros > b.TMicros:
			return 1
		}
		return 0
	})
	return reqs, nil
}

// Commands returns the command lines that give the same summaries as the page: one
// `sluice simulate --compare` when every algorithm runs the shared policy, otherwise one
// `sluice simulate --algorithm` per algorithm. The traffic is --traffic PATTERN, or, with
// jitter or real costs, --trace trace.csv (the requests as Trace writes them, with an actual
// column for real costs). A calendar scenario's say --calendar and --time-zone; one with a start,
// --start.
func (sc *Scenario) Commands() []string {
	traffic := "--traffic " + shellQuote(sc.Traffic)
	if sc.Jitter > 0 || sc.Actual.Set {
		traffic = "--trace trace.csv"
	}
	var clock string // --calendar, --time-zone and --start, after the policy's numbers
	if sc.Calendar != sluice.NoCalendar {
		clock += " --calendar " + sc.Calendar.String()
		if sc.Location != nil {
			clock += " --time-zone " + sc.Location.String() // IANA names need no quoting
		}
	}
	if !sc.Start.IsZero() {
		clock += " --start " + formatStart(sc.Start)
	}
	if sc.Instances > 1 {
		clock += " --instances " + strconv.Itoa(sc.Instances) + " --store " + sc.Stores.String() + fleetFlags(sc)
	}
	for _, c := range sc.Changes {
		clock += " --change " + c.String()
	}
	if sc.IsCompare() {
		if sc.Calendar != sluice.NoCalendar {
			return []string{fmt.Sprintf("sluice simulate --compare --limit %d%s %s", sc.Limit, clock, traffic)}
		}
		return []string{fmt.Sprintf("sluice simulate --compare --limit %d --period %s --burst %d%s %s",
			sc.Limit, formatDuration(sc.Period), sc.Burst, clock, traffic)}
	}
	var cmds []string
	for _, p := range sc.Policies() {
		if p.Calendar != sluice.NoCalendar {
			cmds = append(cmds, fmt.Sprintf("sluice simulate --algorithm %v --limit %d%s %s", p.Algorithm, p.Limit, clock, traffic))
			continue
		}
		burst := ""
		if sim.TakesBurst(p.Algorithm) {
			burst = fmt.Sprintf(" --burst %d", p.Burst)
		}
		cmds = append(cmds, fmt.Sprintf("sluice simulate --algorithm %v --limit %d --period %s%s%s %s",
			p.Algorithm, p.Limit, formatDuration(p.Period), burst, clock, traffic))
	}
	return cmds
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
