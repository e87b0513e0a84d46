package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// freezer stops and resumes redis-server processes (SIGSTOP, SIGCONT): a Redis that hangs as a
// stalled host or a paused VM does — the kernel still accepts what clients send, and nothing
// runs until it resumes, when everything queued on the sockets runs at once.
type freezer struct {
	t    *testing.T
	pids []int
}

func newFreezer(t *testing.T, srvs ...*redistest.Server) *freezer {
	t.Helper()
	f := &freezer{t: t}
	for _, srv := range srvs {
		pid, err := strconv.Atoi(infoField(t, srv, "server", "process_id"))
		if err != nil || pid <= 0 {
			t.Fatalf("INFO server: process_id %d %v", pid, err)
		}
		f.pids = append(f.pids, pid)
	}
	t.Cleanup(f.thaw) // never leave a server stopped (its Kill at cleanup works either way)
	return f
}

// freeze stops the servers and returns once the kernel says each is stopped: kill returns when
// the signal is queued, and a server running on another core may still execute (and answer in
// time) a command sent after it.
func (f *freezer) freeze() {
	for _, pid := range f.pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			f.t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	for _, pid := range f.pids {
		if !pollUntil(time.Now().Add(5*time.Second), func() bool { return processState(pid) == 'T' }) {
			f.t.Fatalf("redis-server %d is not stopped 5 s after SIGSTOP (state %c)", pid, processState(pid))
		}
	}
}

// processState is the state letter of /proc/PID/stat (T: stopped by a signal); 0 if unreadable.
func processState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) S ...: comm may hold spaces and parentheses, so the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

func (f *freezer) thaw() {
	for _, pid := range f.pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// scriptsRun returns how many script calls (FCALL, EVALSHA and EVAL) the servers have run, and
// how many of them replied an error: both from one INFO of each server, so that a call that runs
// meanwhile (one whose connection's handshake waited out the hang) is in both or in neither.
func scriptsRun(t *testing.T, srvs ...*redistest.Server) (ran, failed int64) {
	t.Helper()
	for _, srv := range srvs {
		info := mustDo(t, srv, "INFO", "commandstats")
		for _, cmd := range []string{"fcall", "evalsha", "eval"} {
			for _, line := range strings.Split(info, "\r\n") {
				stats, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
				if !ok {
					continue
				}
				for _, kv := range strings.Split(stats, ",") {
					k, v, _ := strings.Cut(kv, "=")
					n, err := strconv.ParseInt(v, 10, 64)
					switch {
					case k != "calls" && k != "failed_calls":
					case err != nil:
						t.Fatalf("commandstats %s: %q", cmd, kv)
					case k == "calls":
						ran += n
					default:
						failed += n
					}
				}
			}
		}
	}
	return ran, failed
}

// prefixKeys returns the keys under prefix on every server.
func prefixKeys(t *testing.T, prefix string, srvs ...*redistest.Server) []string {
	t.Helper()
	var keys []string
	for _, srv := range srvs {
		keys = append(keys, strings.Fields(mustDo(t, srv, "KEYS", prefix+"*"))...)
	}
	return keys
}

// TestTimedOutCallsConsumeNothing: a decision that the store gave up on — its caller was told
// ErrStoreUnavailable, which the gateway answers "503, used no quota" — must use no quota, even
// though its script call is still queued on the socket of a Redis that hangs (SIGSTOP), and runs
// when Redis resumes (SIGCONT). The script finds its deadline passed (on Redis's clock) and writes
// nothing; afterwards decisions work normally, starting from a full quota.
//
// On a single server one script per decision (MaxBatch 1), batched, and DecideAll; on a 3-master
// Redis Cluster, batched (per slot) and one by one.
func TestTimedOutCallsConsumeNothing(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	p := sluice.Policy{Name: "frozen", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
	tb := sluice.Policy{Name: "frozen-tb", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Hour}
	for _, tc := range []struct {
		name     string
		cluster  bool
		maxBatch int
		multi    bool
	}{
		{"single-server/one-script-per-decision", false, 1, false},
		{"single-server/batched", false, 0, false},
		{"single-server/DecideAll", false, 0, true},
		{"cluster/one-script-per-decision", true, 1, false},
		{"cluster/batched", true, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := []*redistest.Server{srv}
			opts := redis.Options{Addrs: []string{srv.Addr}}
			if tc.cluster {
				srvs, opts.Addrs = cluster.Servers, cluster.Addrs()
			}
			prefix := fmt.Sprintf("frozen-%d:", time.Now().UnixNano())
			opts.Prefix, opts.Timeout, opts.MaxBatch, opts.NegativeCacheSize = prefix, 50*time.Millisecond, tc.maxBatch, -1
			st, err := redis.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			decide := func(ctx context.Context, key string) (sluice.Decision, error) {
				if !tc.multi {
					return st.Decide(ctx, key, p, 1)
				}
				out := make([]sluice.Decision, 2)
				_, err := st.DecideAll(ctx, key, []sluice.Limit{{Policy: p, Cost: 1}, {Policy: tb, Cost: 1}}, out)
				return out[0], err
			}
			// The library is loaded (FCALL, not a load round trip, is what gets queued), and
			// a cluster client knows its slots.
			var d sluice.Decision
			if !pollUntil(time.Now().Add(5*time.Second), func() bool {
				d, err = decide(bg, "warm-up")
				return err == nil
			}) || !d.Allowed {
				t.Fatalf("warm-up: %+v %v", d, err)
			}
			ran, failed := scriptsRun(t, srvs...)
			calls := st.Stats().Calls

			f := newFreezer(t, srvs...)
			f.freeze()
			// 12 decisions, 4 keys, from concurrent callers with short deadlines of their own
			// (20 ms) and the store's (50 ms): each is told the store is unavailable.
			const callers, perCaller = 4, 3
			var wg sync.WaitGroup
			errs := make(chan error, callers*perCaller)
			for g := range callers {
				timeout := 20 * time.Millisecond
				if g%2 == 1 {
					timeout = time.Second // the store's own 50 ms ends first
				}
				wg.Go(func() {
					for range perCaller {
						ctx, cancel := context.WithTimeout(bg, timeout)
						d, err := decide(ctx, fmt.Sprintf("client-%d", g))
						cancel()
						if !errors.Is(err, sluice.ErrStoreUnavailable) {
							errs <- fmt.Errorf("caller %d, Redis stopped: %+v %v; want ErrStoreUnavailable", g, d, err)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			sent := st.Stats().Calls - calls
			// The calls wait on the stopped server's sockets a while after their deadlines, as
			// in a hang.
			time.Sleep(100 * time.Millisecond) // the hang's length is the subject, not synchronisation
			f.thaw()

			// Every script call queued on Redis's sockets runs now, before a command on a fresh
			// connection: Redis reads the sockets that were ready when it resumed first.
			for _, s := range srvs {
				mustDo(t, s, "PING")
			}
			ranNow, failedNow := scriptsRun(t, srvs...)
			t.Logf("%d script calls sent while Redis was stopped; %d reached it and ran when it resumed, %d of them replied an error",
				sent, ranNow-ran, failedNow-failed)
			if ranNow == ran {
				t.Fatal("no script call reached the stopped Redis: the test tests nothing")
			}
			if keys := prefixKeys(t, prefix+"{client-", srvs...); len(keys) != 0 {
				var state []string
				for _, k := range keys {
					for _, s := range srvs {
						if h, err := s.Do("HGETALL", k); err == nil && h != "" {
							state = append(state, k+": "+strings.ReplaceAll(h, "\n", " "))
						}
					}
				}
				t.Fatalf("decisions answered ErrStoreUnavailable consumed quota when Redis resumed: %q", state)
			}
			// A single decision's script (and DecideAll's) fails as a whole after its deadline; a
			// batch of several marks each passed decision in its reply instead (batch.lua), so
			// there the keys above, nothing written, are the whole check.
			if (tc.maxBatch == 1 || tc.multi) && failedNow-failed != ranNow-ran {
				t.Fatalf("of the %d script calls that ran late, %d replied an error; want all (deadline passed)", ranNow-ran, failedNow-failed)
			}

			// And afterwards decisions work normally, from a full quota.
			if !pollUntil(time.Now().Add(5*time.Second), func() bool {
				d, err = decide(bg, "client-0")
				return err == nil
			}) {
				t.Fatalf("decisions do not work after Redis resumed: %v", err)
			}
			if !d.Allowed || d.Remaining != p.Limit-1 {
				t.Fatalf("first decision after Redis resumed: %+v; want approved with Remaining %d (nothing consumed before)", d, p.Limit-1)
			}
			for i := range 5 {
				// (A call that times out on a machine still catching up consumes nothing either:
				// its retry must see the same remaining quota.)
				pollUntil(time.Now().Add(5*time.Second), func() bool {
					d, err = decide(bg, "client-1")
					return !errors.Is(err, sluice.ErrStoreUnavailable)
				})
				if err != nil || !d.Allowed || d.Remaining != p.Limit-1-int64(i) {
					t.Fatalf("decision %d on client-1 after Redis resumed: %+v %v", i, d, err)
				}
			}
		})
	}
}
