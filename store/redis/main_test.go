package redis_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestMain checks that no test of this package leaves a goroutine behind (a store's connections
// included: every test closes its stores). It is also the entry point of the child processes of
// process_test.go: the test binary re-executed with childEnv set runs childMain instead of the
// tests.
//
// One rueidis goroutine is let go: a Redis Cluster client's delayed topology refresh
// ((*call).DelayDo), which sleeps a random delay of up to a second (for clusters under 100 nodes)
// before one refresh, which fails at once on a closed client, and then ends. It may still be
// asleep when the last test has closed its cluster store; goleak would not wait that long.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		// A closed cluster client's background topology refresh sleeps out its interval and ends.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// openStore returns a store on srv, closed when the test ends, with newStore's test timeout
// unless opts sets one: a busy machine must not turn a slow reply into a test failure.
func openStore(t testing.TB, srv *redistest.Server, opts redis.Options) *redis.Store {
	t.Helper()
	opts.Addrs = []string{srv.Addr}
	return newStore(t, opts)
}

// mustDo runs one command on srv (a connection of its own, not the store's) and returns the reply.
func mustDo(t testing.TB, srv *redistest.Server, args ...string) string {
	t.Helper()
	r, err := srv.Do(args...)
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return r
}

// mustInt runs a command whose reply is an integer.
func mustInt(t testing.TB, srv *redistest.Server, args ...string) int64 {
	t.Helper()
	r := mustDo(t, srv, args...)
	n, err := strconv.ParseInt(r, 10, 64)
	if err != nil {
		t.Fatalf("redis %v: reply %q is not an integer", args, r)
	}
	return n
}

// redisTime returns Redis's own clock (TIME) in µs since the epoch.
func redisTime(t testing.TB, srv *redistest.Server) int64 {
	t.Helper()
	parts := strings.Split(mustDo(t, srv, "TIME"), "\n")
	if len(parts) != 2 {
		t.Fatalf("TIME replied %q", parts)
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME replied %q", parts)
	}
	return sec*1_000_000 + usec
}

// infoField returns field of an INFO section ("cmdstat_time" of "commandstats" gives
// "calls=3,usec=...", "number_of_cached_scripts" of "memory" a number); "" if absent.
func infoField(t testing.TB, srv *redistest.Server, section, field string) string {
	t.Helper()
	for _, line := range strings.Split(mustDo(t, srv, "INFO", section), "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// cmdstat returns one counter of INFO commandstats for cmd ("calls", "failed_calls"), 0 if cmd
// has not run since the server started or CONFIG RESETSTAT.
func cmdstat(t testing.TB, srv *redistest.Server, cmd, counter string) int64 {
	t.Helper()
	for _, kv := range strings.Split(infoField(t, srv, "commandstats", "cmdstat_"+cmd), ",") {
		if v, ok := strings.CutPrefix(kv, counter+"="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("commandstats %s: %q", cmd, kv)
			}
			return n
		}
	}
	return 0
}

// monitor records every command Redis runs (MONITOR), the scripts' own redis.call included,
// until stopped.
type monitor struct {
	conn net.Conn
	done chan struct{}

	mu    sync.Mutex
	lines []monitorLine // guarded by mu
}

// monitorLine is one command seen by MONITOR: who ran it ("lua" for a script's redis.call, else
// the client's address) and its arguments, the command name upper-cased.
type monitorLine struct {
	Source string
	Args   []string
}

func startMonitor(t testing.TB, srv *redistest.Server) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", srv.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("*1\r\n$7\r\nMONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if ok, err := r.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", ok, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	m := &monitor{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if ml, ok := parseMonitorLine(strings.TrimRight(line, "\r\n")); ok {
				m.mu.Lock()
				m.lines = append(m.lines, ml)
				m.mu.Unlock()
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

// sync makes sure that every command Redis ran before it is recorded: it runs a marker command
// and waits for it to come through.
func (m *monitor) sync(t testing.TB, srv *redistest.Server) {
	t.Helper()
	marker := fmt.Sprintf("monitor-sync-%d", time.Now().UnixNano())
	mustDo(t, srv, "ECHO", marker)
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, l := range m.snapshot() {
			if len(l.Args) == 2 && l.Args[0] == "ECHO" && l.Args[1] == marker {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("MONITOR did not show the marker command within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (m *monitor) snapshot() []monitorLine {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]monitorLine(nil), m.lines...)
}

func (m *monitor) reset() {
	m.mu.Lock()
	m.lines = nil
	m.mu.Unlock()
}

func (m *monitor) stop() {
	m.conn.Close()
	<-m.done
}

// parseMonitorLine parses `+1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "ab" "2" ...`.
func parseMonitorLine(line string) (monitorLine, bool) {
	if !strings.HasPrefix(line, "+") {
		return monitorLine{}, false
	}
	lb, rb := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	if lb < 0 || rb < lb {
		return monitorLine{}, false
	}
	var ml monitorLine
	if f := strings.Fields(line[lb+1 : rb]); len(f) == 2 {
		ml.Source = f[1]
	}
	rest := line[rb+1:]
	for {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		rest = rest[i+1:]
		var b strings.Builder
		for len(rest) > 0 && rest[0] != '"' {
			c := rest[0]
			if c == '\\' && len(rest) > 1 {
				switch rest[1] {
				case 'n':
					c = '\n'
				case 'r':
					c = '\r'
				case 't':
					c = '\t'
				case 'a':
					c = '\a'
				case 'b':
					c = '\b'
				case 'x':
					if len(rest) >= 4 {
						if v, err := strconv.ParseUint(rest[2:4], 16, 8); err == nil {
							b.WriteByte(byte(v))
							rest = rest[4:]
							continue
						}
					}
					c = 'x'
				default:
					c = rest[1]
				}
				rest = rest[2:]
			} else {
				rest = rest[1:]
			}
			b.WriteByte(c)
		}
		if len(rest) > 0 {
			rest = rest[1:]
		}
		ml.Args = append(ml.Args, b.String())
	}
	if len(ml.Args) == 0 {
		return monitorLine{}, false
	}
	ml.Args[0] = strings.ToUpper(ml.Args[0])
	return ml, true
}

// pollUntil calls cond every few milliseconds until it returns true or the deadline passes; it
// reports whether cond came true.
func pollUntil(deadline time.Time, cond func() bool) bool {
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var bg = context.Background()
