// Package regiontest is issue 34's harness of limits across regions, shared by the end-to-end
// test (cmd/sluice, TestServeE2ERegionsWorld) and the benchmark (bench/regionsload,
// scripts/bench-regions.sh): real processes on loopback —
//
//   - one redis-server for the ledger (the global Redis);
//   - per region, its own redis-server and Instances `sluice serve` pooled on it;
//   - per region, one netfault.Proxy between its instances and the global Redis, adding Latency
//     each way (50–150 ms by default) and able to cut that region's link alone;
//   - an upstream that counts every request that reaches it;
//
// and a load generator (load.go) that sends each region's demand to its instances in turn and
// attributes every admitted request to the fixed window its decision was made in, exactly.
package regiontest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/internal/netfault"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// Policy is the name of the one policy every instance runs.
const Policy = "partner"

// Options describe a harness. Zero fields take the defaults noted.
type Options struct {
	Bin       string // the sluice binary (required unless Launch is set)
	Limit     int64  // the policy's limit (worldwide with Global, per region without)
	Period    time.Duration
	Global    bool // global: true; false: the same policy as each region's own limit
	Regions   int  // 3
	Instances int  // per region; 2
	// The region section (see docs/config.md): Refresh, Lease, Hold (0: the algorithm's), Floor
	// and SafeShare as fractions of the limit (0: sluice's defaults), the ledger's Algorithm.
	Refresh, Lease, Hold time.Duration
	Floor, SafeShare     float64
	Algorithm            string
	// Latency is added each way on every region's link to the global Redis (default
	// Uniform(50ms, 150ms)).
	Latency *netfault.Latency
	// Launch starts one sluice serve with the configuration cfg writes for its two addresses and
	// returns its proxy and admin base URLs (http://host:port); nil: the harness starts Bin itself.
	Launch func(tb testing.TB, name string, cfg func(listen, admin string) string) (proxy, admin string)
}

// Harness is a running set of regions.
type Harness struct {
	Opts      Options
	Global    *redistest.Server   // the ledger's Redis
	Regional  []*redistest.Server // each region's own
	Links     []*netfault.Proxy   // region i's link to the global Redis
	Instances [][]Instance        // region i's sluice serve instances
	Upstream  *Upstream
	ledger    *redisstore.Ledger // read directly (not through a link)
}

// Instance is one sluice serve.
type Instance struct {
	Region       int
	Proxy, Admin string // base URLs
}

// RegionName is region i's name in the ledger.
func RegionName(i int) string { return fmt.Sprintf("r%d", i) }

// Start starts the harness; everything is stopped when tb ends.
func Start(tb testing.TB, o Options) *Harness {
	tb.Helper()
	if o.Regions == 0 {
		o.Regions = 3
	}
	if o.Instances == 0 {
		o.Instances = 2
	}
	if o.Latency == nil {
		l := netfault.Uniform(50*time.Millisecond, 150*time.Millisecond)
		o.Latency = &l
	}
	if o.Launch == nil {
		o.Launch = launcher(o.Bin)
	}
	h := &Harness{Opts: o, Global: redistest.Start(tb), Upstream: NewUpstream(tb)}
	dir := tb.TempDir()
	h.Instances = make([][]Instance, o.Regions)
	for range o.Regions {
		h.Regional = append(h.Regional, redistest.Start(tb))
		link := netfault.Start(tb, h.Global.Addr)
		link.SetLatency(*o.Latency, *o.Latency)
		h.Links = append(h.Links, link)
	}
	// One at a time: two instances started at once could pick the same free port, and the one
	// that failed to bind it would look ready through the other's admin listener.
	for i := range o.Regions {
		for j := range o.Instances {
			proxy, admin := o.Launch(tb, filepath.Join(dir, fmt.Sprintf("%s-%d.yaml", RegionName(i), j)), h.config(i))
			h.Instances[i] = append(h.Instances[i], Instance{Region: i, Proxy: proxy, Admin: admin})
		}
	}
	for _, ins := range h.Instances {
		for _, in := range ins {
			c, err := net.Dial("tcp", strings.TrimPrefix(in.Proxy, "http://"))
			if err != nil {
				tb.Fatalf("regiontest: the instance at %s: %v", in.Proxy, err)
			}
			c.Close()
		}
	}
	st, err := redisstore.New(redisstore.Options{Addrs: []string{h.Global.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	floor := int64(o.Floor * float64(o.Limit))
	if o.Floor == 0 {
		floor = o.Limit / int64(2*o.Regions) // sluice's default, 1/(2·regions)
	}
	hold := o.Hold
	if hold == 0 {
		hold = o.Period // a fixed window's (redisstore.LedgerHold)
	}
	h.ledger, err = st.Ledger(Policy, redisstore.LedgerOptions{Limit: o.Limit, Regions: o.Regions, Floor: floor, Lease: o.Lease, Hold: hold, Algorithm: allot.Fair})
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// config is region i's instances' configuration.
func (h *Harness) config(i int) func(listen, admin string) string {
	o := h.Opts
	var extra strings.Builder
	if o.Hold > 0 {
		fmt.Fprintf(&extra, "  hold: %v\n", o.Hold)
	}
	if o.Floor > 0 {
		fmt.Fprintf(&extra, "  floor: %v\n", o.Floor)
	}
	if o.SafeShare > 0 {
		fmt.Fprintf(&extra, "  safe_share: %v\n", o.SafeShare)
	}
	if o.Algorithm != "" {
		fmt.Fprintf(&extra, "  algorithm: %s\n", o.Algorithm)
	}
	regional, link, up := h.Regional[i].Addr, h.Links[i].Addr(), h.Upstream.URL
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store: {type: redis, addrs: [%s], timeout: 2s, slow_timeout: 2s}
region:
  name: %s
  regions: %d
  global: {addrs: [%s], timeout: 1s}
  refresh: %v
  lease: %v
%spolicies:
  - {name: %s, algorithm: fixed-window, limit: %d, period: %v, global: %t, key_by: []}
default_policy: %s
`, listen, admin, up, regional, RegionName(i), o.Regions, link,
			o.Refresh, o.Lease, extra.String(), Policy, o.Limit, o.Period, o.Global, Policy)
	}
}

// Ledger reads the ledger on the global Redis (directly, not through a region's link).
func (h *Harness) Ledger(ctx context.Context) (redisstore.LedgerView, error) {
	return h.ledger.Read(ctx)
}

// --- the upstream ---------------------------------------------------------------------------

// Upstream is the API behind every instance: it counts the requests that reach it, those of the
// direct calls (path /direct, the latency baseline) apart.
type Upstream struct {
	*httptest.Server
	admitted, direct atomic.Int64
}

// NewUpstream starts an upstream, closed when tb ends.
func NewUpstream(tb testing.TB) *Upstream {
	u := &Upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/direct" {
			u.direct.Add(1)
		} else {
			u.admitted.Add(1)
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	}))
	tb.Cleanup(u.Close)
	return u
}

// Admitted is how many requests other than the direct calls reached the upstream.
func (u *Upstream) Admitted() int64 { return u.admitted.Load() }

// --- sluice processes -----------------------------------------------------------------------

// launcher starts bin serve --config name --watch 0 on two free loopback ports and waits for
// its /readyz; the process is stopped (SIGTERM) when tb ends.
func launcher(bin string) func(tb testing.TB, name string, cfg func(listen, admin string) string) (string, string) {
	return func(tb testing.TB, name string, cfg func(listen, admin string) string) (string, string) {
		for attempt := 1; ; attempt++ {
			listen, admin := freeAddr(tb), freeAddr(tb)
			if err := os.WriteFile(name, []byte(cfg(listen, admin)), 0o600); err != nil {
				tb.Error(err)
				return "", ""
			}
			cmd := exec.Command(bin, "serve", "--config", name, "--watch", "0")
			stderr, err := os.Create(name + ".stderr")
			if err != nil {
				tb.Error(err)
				return "", ""
			}
			defer stderr.Close() // the process has its own
			cmd.Stdout, cmd.Stderr = io.Discard, stderr
			if err := cmd.Start(); err != nil {
				tb.Error(err)
				return "", ""
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			tb.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(15 * time.Second):
					_ = cmd.Process.Kill()
					<-done
				}
			})
			if waitReady("http://"+admin, done, 20*time.Second) {
				return "http://" + listen, "http://" + admin
			}
			logged, _ := os.ReadFile(stderr.Name())
			if attempt < 3 && strings.Contains(string(logged), "address already in use") {
				continue
			}
			tb.Errorf("regiontest: %s did not become ready\n%s", name, logged)
			return "", ""
		}
	}
}

func waitReady(admin string, done <-chan struct{}, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return false
		default:
		}
		if resp, err := http.Get(admin + "/readyz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the admin listener
	}
	return false
}

func freeAddr(tb testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// --- the ledger, watched --------------------------------------------------------------------

// Refresh is one region's record in the ledger as one of its refreshes left it, with the others'
// in the same read.
type Refresh struct {
	N         int       // its ordinal among the region's refreshes watched (1, 2, …)
	At        time.Time // the refresh's instant (the ledger's clock)
	Want      int64
	Allotment int64
	Share     int64 // the fair share of the wants of every live region in the same read (each raised to the floor)
	Learning  bool  // the ledger was in learning mode at the read
	// What the ledger counts for it beside its allotment: its use (until UsedUntil) and the
	// allotment it reported enforcing (a larger one in flight: Pending).
	Used, Pending int64
	UsedUntil     time.Time
}

// Watch reads the ledger every 5 ms (directly) and keeps every region's refreshes: each new At
// of a region's record is one (refreshes are at least a refresh interval and two round trips of
// the link apart, so none is missed while the reads keep up; Watch counts the reads that took
// longer than 100 ms, which could have missed one, in Slow).
type Watch struct {
	mu        sync.Mutex
	refreshes map[string][]Refresh
	reads     []Read
	slow      int
	stop      context.CancelFunc
	done      chan struct{}
}

// Watch starts watching the ledger; it stops when tb ends.
func (h *Harness) Watch(tb testing.TB) *Watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watch{refreshes: map[string][]Refresh{}, stop: cancel, done: make(chan struct{})}
	floor := h.ledger.Options().Floor
	go func() {
		defer close(w.done)
		last := time.Now()
		for ctx.Err() == nil {
			v, err := h.Ledger(ctx)
			now := time.Now()
			if now.Sub(last) > 100*time.Millisecond {
				w.mu.Lock()
				w.slow++
				w.mu.Unlock()
			}
			last = now
			if err == nil {
				w.add(v, h.Opts.Limit, floor, h.Opts.Regions)
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond): // polling the ledger
			}
		}
	}()
	tb.Cleanup(func() { cancel(); <-w.done })
	return w
}

func (w *Watch) add(v redisstore.LedgerView, limit, floor int64, regions int) {
	var live []int
	wants := make([]int64, 0, len(v.Regions))
	for i, r := range v.Regions {
		if r.Live {
			live = append(live, i)
			wants = append(wants, max(r.Want, floor))
		}
	}
	shares := allot.FairShare(limit-floor*int64(max(0, regions-len(live))), wants)
	rd := Read{Now: v.Now, Learning: v.Learning, Holding: map[string]int64{}, Share: map[string]int64{}}
	for k, i := range live {
		rd.Holding[v.Regions[i].Region], rd.Share[v.Regions[i].Region] = v.Regions[i].Holding, shares[k]
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.reads); n == 0 || w.reads[n-1].Learning != rd.Learning || !maps.Equal(w.reads[n-1].Holding, rd.Holding) || !maps.Equal(w.reads[n-1].Share, rd.Share) {
		w.reads = append(w.reads, rd)
	}
	for i, r := range v.Regions {
		seen := w.refreshes[r.Region]
		if len(seen) > 0 && seen[len(seen)-1].At.Equal(r.At) {
			continue
		}
		rf := Refresh{N: len(seen) + 1, At: r.At, Want: r.Want, Allotment: r.Allotment, Share: -1, Learning: v.Learning,
			Used: r.Used, Pending: r.Pending, UsedUntil: r.UsedUntil}
		if k := slices.Index(live, i); k >= 0 {
			rf.Share = shares[k]
		}
		w.refreshes[r.Region] = append(seen, rf)
	}
}

// Read is one read of the ledger (kept when it differs from the one before): each live region's
// holding (what the ledger counts for it: its allotment, a larger one it may still enforce, its
// use) and its fair share of the wants then.
type Read struct {
	Now            time.Time // the ledger's clock
	Learning       bool
	Holding, Share map[string]int64
}

// Reads returns the reads kept so far.
func (w *Watch) Reads() []Read {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reads)
}

// Refreshes returns region's refreshes watched so far, and how many reads were slow.
func (w *Watch) Refreshes(region string) ([]Refresh, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.refreshes[region]), w.slow
}
