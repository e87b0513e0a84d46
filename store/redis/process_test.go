package redis_test

// The race that a shared store exists to win, fought by real OS processes: each child process is
// this test binary re-executed (TestMain sends it to childMain), with its own redis.Store and so
// its own connections, exactly like separate gateway instances. The children are started once
// and driven round by round over stdin/stdout, one JSON line each way; within a round every
// child parks its goroutines until the parent writes "go" to all of them, so that the requests
// reach Redis at the same instant from different processes.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

const (
	childEnv     = "SLUICE_REDIS_TEST_CHILD"
	childAddrEnv = "SLUICE_REDIS_TEST_ADDR"
)

// childRound is what the parent asks of every child in one round: goroutines × requests
// requests of cost 1 on key under the policy, all released at once.
type childRound struct {
	Key        string
	Policy     wirePolicy
	Goroutines int
	Requests   int  // per goroutine
	NoCache    bool // decide on the child's store without a negative cache
}

// wirePolicy is a period policy as a round carries it in JSON (sluice.Policy's Calendar and
// Location do not encode when unset).
type wirePolicy struct {
	Name      string
	Algorithm sluice.Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
}

func wire(p sluice.Policy) wirePolicy {
	return wirePolicy{Name: p.Name, Algorithm: p.Algorithm, Limit: p.Limit, Period: p.Period, Burst: p.Burst}
}

func (w wirePolicy) policy() sluice.Policy {
	return sluice.Policy{Name: w.Name, Algorithm: w.Algorithm, Limit: w.Limit, Period: w.Period, Burst: w.Burst}
}

// childReply is a child's one line of JSON: Ready once at start, Armed when its goroutines are
// parked, then the round's results.
type childReply struct {
	Ready, Armed bool
	Approved     int
	Refused      int
	Remaining    []int64  // Remaining of each approval
	Starts       []int64  // when each goroutine was released, ns since the epoch
	Calls        uint64   // script calls the child's store made in the round (batches count once)
	Problems     []string // decisions that break the store's contract, and errors
}

// childMain is a child process: it decides what the parent sends it on its own stores.
func childMain() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	addr := os.Getenv(childAddrEnv)
	// A long timeout: this child tests atomicity, not latency, and 8 race-enabled processes
	// share two cores.
	cached, err := redis.New(redis.Options{Addrs: []string{addr}, Timeout: 10 * time.Second})
	if err != nil {
		return fail(err)
	}
	defer cached.Close()
	uncached, err := redis.New(redis.Options{Addrs: []string{addr}, Timeout: 10 * time.Second, NegativeCacheSize: -1})
	if err != nil {
		return fail(err)
	}
	defer uncached.Close()
	// Warm up: connections open and every script loaded (a peek writes nothing).
	for _, s := range []*redis.Store{cached, uncached} {
		for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket} {
			p := sluice.Policy{Name: "warm-up", Algorithm: a, Limit: 1, Period: time.Second}
			if _, err := s.Decide(bg, "warm-up", p, 0); err != nil {
				return fail(err)
			}
		}
	}
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	if err := out.Encode(childReply{Ready: true}); err != nil {
		return fail(err)
	}
	for in.Scan() {
		var r childRound
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			return fail(err)
		}
		policy := r.Policy.policy()
		store := cached
		if r.NoCache {
			store = uncached
		}
		var (
			parked, done sync.WaitGroup
			start        = make(chan struct{})
			mu           sync.Mutex
			reply        childReply
		)
		for g := 0; g < r.Goroutines; g++ {
			parked.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				parked.Done()
				<-start
				released := time.Now().UnixNano()
				mu.Lock()
				reply.Starts = append(reply.Starts, released)
				mu.Unlock()
				for i := 0; i < r.Requests; i++ {
					d, err := store.Decide(bg, r.Key, policy, 1)
					mu.Lock()
					switch {
					case err != nil:
						reply.Problems = append(reply.Problems, err.Error())
					case d.Limit != policy.Capacity() || d.Fallback != sluice.NoFallback:
						reply.Problems = append(reply.Problems, fmt.Sprintf("decision %+v", d))
					case d.Allowed:
						reply.Approved++
						reply.Remaining = append(reply.Remaining, d.Remaining)
						if d.Remaining < 0 || d.RetryAfter != 0 {
							reply.Problems = append(reply.Problems, fmt.Sprintf("approval %+v", d))
						}
					default:
						reply.Refused++
						if d.RetryAfter <= 0 || d.Remaining != 0 {
							reply.Problems = append(reply.Problems, fmt.Sprintf("refusal %+v", d))
						}
					}
					mu.Unlock()
				}
			}()
		}
		parked.Wait()
		if err := out.Encode(childReply{Armed: true}); err != nil {
			return fail(err)
		}
		if !in.Scan() || in.Text() != "go" {
			return fail(fmt.Errorf("want go, got %q (%v)", in.Text(), in.Err()))
		}
		calls := store.Stats().Calls
		close(start)
		done.Wait()
		reply.Calls = store.Stats().Calls - calls
		if err := out.Encode(reply); err != nil {
			return fail(err)
		}
	}
	if err := in.Err(); err != nil {
		return fail(err)
	}
	return 0
}

// childProc is a running child process, seen from the parent.
type childProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte // its stdout, a line at a time; closed at EOF
	stderr string      // the file its stderr goes to
}

// startChildren starts n child processes deciding on srv and waits until each is ready; they
// exit, and their exit status is checked, when the test ends.
func startChildren(t *testing.T, srv *redistest.Server, n int) []*childProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	kids := make([]*childProc, n)
	for i := range kids {
		c := &childProc{lines: make(chan []byte, 4), stderr: filepath.Join(t.TempDir(), "stderr")}
		c.cmd = exec.Command(exe, "-test.run=^$")
		// atexit_sleep_ms=0: a race-enabled binary otherwise lingers a second at exit.
		c.cmd.Env = append(os.Environ(), childEnv+"=1", childAddrEnv+"="+srv.Addr,
			"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		errf, err := os.Create(c.stderr)
		if err != nil {
			t.Fatal(err)
		}
		c.cmd.Stderr = errf
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		errf.Close()
		go func() {
			defer close(c.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.lines <- slices.Clone(sc.Bytes())
			}
		}()
		kids[i] = c
	}
	t.Cleanup(func() {
		for _, c := range kids {
			if c != nil {
				c.stdin.Close() // ends the child
			}
		}
		for _, c := range kids {
			if c != nil {
				c.wait(t)
			}
		}
	})
	for _, c := range kids {
		if r := c.read(t); !r.Ready {
			t.Fatalf("child %d: want ready, got %+v", c.cmd.Process.Pid, r)
		}
	}
	return kids
}

// read returns the child's next line of JSON, failing the test if none comes within 30s.
func (c *childProc) read(t *testing.T) childReply {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			log, _ := os.ReadFile(c.stderr)
			t.Fatalf("child %d exited early: %s", c.cmd.Process.Pid, log)
		}
		var r childReply
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("child %d wrote %q: %v", c.cmd.Process.Pid, line, err)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("child %d said nothing for 30s", c.cmd.Process.Pid)
	}
	panic("unreachable")
}

func (c *childProc) write(t *testing.T, line []byte) {
	t.Helper()
	if _, err := c.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("writing to child %d: %v", c.cmd.Process.Pid, err)
	}
}

// wait waits for the child to exit once its stdin is closed, and checks that it exited cleanly
// (a data race found by the race detector in a child makes it exit with status 66).
func (c *childProc) wait(t *testing.T) {
	for range c.lines { // drain until EOF, so that the reader goroutine ends
	}
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			log, _ := os.ReadFile(c.stderr)
			t.Errorf("child %d: %v\n%s", c.cmd.Process.Pid, err, log)
		}
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
		t.Errorf("child %d did not exit within 10s of its stdin closing", c.cmd.Process.Pid)
	}
}

// runRound has every child in kids make the round's requests at the same instant and returns
// their replies.
func runRound(t *testing.T, kids []*childProc, r childRound) []childReply {
	t.Helper()
	line, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kids {
		c.write(t, line)
	}
	for _, c := range kids {
		if a := c.read(t); !a.Armed {
			t.Fatalf("child %d: want armed, got %+v", c.cmd.Process.Pid, a)
		}
	}
	for _, c := range kids { // as close together as the parent can write
		c.write(t, []byte("go"))
	}
	replies := make([]childReply, len(kids))
	for i, c := range kids {
		replies[i] = c.read(t)
		for _, p := range replies[i].Problems {
			t.Errorf("child %d: %s", c.cmd.Process.Pid, p)
		}
	}
	return replies
}

// sameWindow reports whether Redis's clock is still in the window (of period) it was in at
// before µs: the exact counts below assume that no fixed or sliding window rolled over during a
// round. With an hour's period that practically never happens; if it does, the round is redone.
func sameWindow(t *testing.T, srv *redistest.Server, before int64, p sluice.Policy) bool {
	if p.Algorithm != sluice.FixedWindow && p.Algorithm != sluice.SlidingWindow {
		return true
	}
	return before/p.PeriodMicros() == redisTime(t, srv)/p.PeriodMicros()
}

func TestAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	parent := openStore(t, srv, redis.Options{Timeout: 5 * time.Second, NegativeCacheSize: -1})
	kids := startChildren(t, srv, 8)

	// Exactly one left, 6 processes × 8 goroutines want it at once: exactly one gets it. (More
	// goroutines than the store's batch workers, so that a child also sends several requests on
	// the key in one script call.)
	// Every algorithm, the token bucket in every other round (half of those with a limit of
	// 1 an hour and nothing drained), a fresh key each round.
	t.Run("one-left", func(t *testing.T) {
		racers := kids[:6]
		others := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.LeakyBucket}
		const rounds, perChild = 30, 8
		redone := 0
		var requests, calls uint64
		var spread time.Duration // the most time between two processes' goroutines starting
		for r := 0; r < rounds; r++ {
			p := sluice.Policy{Name: "one-left", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour, Burst: 5}
			switch {
			case r%4 == 2:
				p.Limit, p.Burst = 1, 0
			case r%2 == 1:
				p.Algorithm, p.Burst = others[(r/2)%len(others)], 0
				if p.Algorithm == sluice.LeakyBucket {
					p.Burst = 4 // capacity 5: one served now, four queued
				}
			}
			key := fmt.Sprintf("race-%d-%d", r, time.Now().UnixNano())
			before := redisTime(t, srv)
			for i := int64(1); i < p.Capacity(); i++ {
				d, err := parent.Decide(bg, key, p, 1)
				if err != nil || !d.Allowed || d.Remaining != p.Capacity()-i {
					t.Fatalf("round %d (%v): draining request %d: %+v %v", r, p.Algorithm, i, d, err)
				}
			}
			replies := runRound(t, racers, childRound{Key: key, Policy: wire(p), Goroutines: perChild, Requests: 1})
			if !sameWindow(t, srv, before, p) {
				if redone++; redone > 3 {
					t.Fatal("windows keep rolling over mid-round")
				}
				r--
				continue
			}
			approved, refused := 0, 0
			var starts []int64
			for _, rep := range replies {
				approved += rep.Approved
				refused += rep.Refused
				starts = append(starts, rep.Starts...)
				calls += rep.Calls
				for _, rem := range rep.Remaining {
					if rem != 0 {
						t.Errorf("round %d (%v): the last unit's approval says Remaining %d, want 0", r, p.Algorithm, rem)
					}
				}
			}
			if approved != 1 || refused != len(racers)*perChild-1 {
				t.Fatalf("round %d (%v, one left): %d approved and %d refused of %d simultaneous requests from %d processes, want exactly 1 approved",
					r, p.Algorithm, approved, refused, len(racers)*perChild, len(racers))
			}
			requests += uint64(len(racers) * perChild)
			spread = max(spread, time.Duration(slices.Max(starts)-slices.Min(starts)))
			if d, err := parent.Decide(bg, key, p, 0); err != nil || d.Remaining != 0 {
				t.Fatalf("round %d (%v): after the race a peek says %+v %v, want Remaining 0", r, p.Algorithm, d, err)
			}
		}
		t.Logf("%d rounds of %d processes × %d goroutines: one approval each; goroutines released at most %v apart; %d requests in %d script calls",
			rounds, len(racers), perChild, spread, requests, calls)
	})

	// A fixed window of 100 an hour, 8 processes × 12 goroutines × 8 requests: exactly 100
	// approved, and their Remaining are exactly 99, 98, …, 0 once each — every approval saw the
	// count left by the one before, whichever process made it. Half the rounds without the
	// negative cache, so that every request reaches Redis.
	t.Run("fixed-window-100", func(t *testing.T) {
		p := sluice.Policy{Name: "hammer", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
		const goroutines, requests = 12, 8
		redone := 0
		for r := 0; r < 4; r++ {
			key := fmt.Sprintf("hammer-%d-%d", r, time.Now().UnixNano())
			before := redisTime(t, srv)
			replies := runRound(t, kids, childRound{Key: key, Policy: wire(p), Goroutines: goroutines, Requests: requests, NoCache: r%2 == 0})
			if !sameWindow(t, srv, before, p) {
				if redone++; redone > 3 {
					t.Fatal("windows keep rolling over mid-round")
				}
				r--
				continue
			}
			approved, refused := 0, 0
			var remaining []int64
			var calls uint64
			for _, rep := range replies {
				approved += rep.Approved
				refused += rep.Refused
				remaining = append(remaining, rep.Remaining...)
				calls += rep.Calls
			}
			total := len(kids) * goroutines * requests
			if approved != 100 || refused != total-100 {
				t.Fatalf("round %d: %d approved, %d refused of %d requests from %d processes; want exactly 100 approved", r, approved, refused, total, len(kids))
			}
			slices.Sort(remaining)
			for i, rem := range remaining {
				if rem != int64(i) {
					t.Fatalf("round %d: the approvals' Remaining, sorted, are %v; want 0..99 once each", r, remaining)
				}
			}
			if d, err := parent.Decide(bg, key, p, 0); err != nil || d.Remaining != 0 {
				t.Fatalf("round %d: after the round a peek says %+v %v, want Remaining 0", r, d, err)
			}
			t.Logf("round %d (negative cache %v): %d requests from %d processes, %d script calls; exactly 100 approved",
				r, r%2 == 1, total, len(kids), calls)
		}
	})
}
