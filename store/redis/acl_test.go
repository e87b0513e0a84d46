package redis

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The documented ACL is ACLRules, verbatim: every "ACL SETUSER" line of docs/stores.md and of
// docs/config.md grants exactly the rules that TestACLUser proves sufficient.
func TestDocumentedACL(t *testing.T) {
	line := regexp.MustCompile("ACL SETUSER sluice on >PASSWORD ([^`\n]*)")
	for _, file := range []string{"../../docs/stores.md", "../../docs/config.md"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		found := line.FindAllStringSubmatch(string(b), -1)
		if len(found) == 0 {
			t.Errorf("%s documents no ACL for the Redis user (want `ACL SETUSER sluice on >PASSWORD %s`)", file, ACLRules)
		}
		for _, m := range found {
			// (In a Markdown table a | is written \|, also in code.)
			if strings.ReplaceAll(strings.TrimSpace(m[1]), `\|`, "|") != ACLRules {
				t.Errorf("%s documents the ACL\n\t%s\nwant ACLRules, which the tests use:\n\t%s", file, m[1], ACLRules)
			}
		}
		// Nothing else in the file may describe the user's permissions another way.
		for _, stale := range []string{"+@scripting", "+@read", "+@write"} {
			if strings.Contains(string(b), stale) {
				t.Errorf("%s still mentions %s: the ACL is documented as ACLRules only", file, stale)
			}
		}
	}
}

// TestACLUser: a user created with exactly ACLRules (on every node of a cluster) can do all the
// store does — connect, decide under every algorithm, DecideAll, batched calls, as functions of
// the library (FCALL), loaded again after FUNCTION FLUSH (and scripts re-sent after SCRIPT FLUSH),
// Ping for readiness, the clock readings for deadlines, the fleet's history — on a single server (over a URL with a
// database) and on a 3-master Redis Cluster; and the rules are no wider than that (no other keys,
// no FLUSHALL, no CONFIG). A user with the rules of the versions before the library (no +fcall,
// no +function|load) still decides everything, with the scripts.
func TestACLUser(t *testing.T) {
	policies := []sluice.Policy{
		{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Minute},
		{Name: "sl", Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Minute},
		{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 5, Period: time.Minute},
		{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Minute, Burst: 5},
		{Name: "lb", Algorithm: sluice.LeakyBucket, Limit: 5, Period: time.Minute, Burst: 4},
	}
	rules := ACLRules
	setUser := func(t *testing.T, do func(args ...string) (string, error)) {
		t.Helper()
		if out, err := do(append([]string{"ACL", "SETUSER", "sluice", "on", ">s3cret"}, strings.Fields(rules)...)...); err != nil {
			t.Fatalf("ACL SETUSER sluice on >s3cret %s: %v %s", rules, err, out)
		}
	}
	check := func(t *testing.T, s *Store, flush func()) {
		t.Helper()
		c := s.conn.Load()
		if c == nil {
			t.Fatalf("not connected: %v", s.Ping(bg))
		}
		if want := rules == ACLRules; c.functions != want {
			t.Fatalf("the store calls functions: %v; want %v (rules %s)", c.functions, want, rules)
		}
		if err := s.Ping(bg); err != nil {
			t.Fatalf("Ping (readiness) as the ACL user: %v", err)
		}
		if c.offsets == nil || c.offsets.floorAt.Load() == 0 {
			t.Fatal("the store did not read Redis's clock (TIME) as the ACL user")
		}
		// The fleet's history (history.lua): a slot added to and read back.
		f, err := s.Fleet(FleetOptions{ID: "gw-acl"})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.AddHistory(bg, 180_000_000, map[string]int64{"allowed": 3, "r:partner": 1}); err != nil {
			t.Fatalf("AddHistory as the ACL user: %v", err)
		}
		if got, err := f.History(bg, 180_000_000, 180_000_001); err != nil || got[180_000_000]["allowed"] != 3 || got[180_000_000]["r:partner"] != 1 {
			t.Fatalf("History as the ACL user: %v %v", got, err)
		}
		for round := range 2 {
			if round == 1 {
				flush() // the library and the scripts are gone: FCALL meets Function not found and loads it (EVALSHA meets NOSCRIPT, the client sends EVAL)
			}
			for i, p := range policies {
				key := fmt.Sprintf("acl-%d-%d", round, i)
				if d, err := s.Decide(bg, key, p, 1); err != nil || !d.Allowed || d.Remaining != p.Capacity()-1 {
					t.Fatalf("round %d, %v as the ACL user: %+v %v", round, p.Algorithm, d, err)
				}
				// Again, on the state the first wrote (the commands of a current state: the
				// sliding log's LSET, the state string read back).
				if d, err := s.Decide(bg, key, p, 1); err != nil || !d.Allowed || d.Remaining != p.Capacity()-2 {
					t.Fatalf("round %d, %v as the ACL user, a second request: %+v %v", round, p.Algorithm, d, err)
				}
				// Settlements (lua/settle.lua): an extra charge, then a refund of it all.
				d, _ := s.Decide(bg, key, p, 0)
				if err := s.Settle(bg, key, p, d.At, 1, 3); err != nil {
					t.Fatalf("round %d, %v as the ACL user, a settlement: %v", round, p.Algorithm, err)
				}
				if err := s.Settle(bg, key, p, d.At, 3, 0); err != nil {
					t.Fatalf("round %d, %v as the ACL user, a refund: %v", round, p.Algorithm, err)
				}
			}
			limits := make([]sluice.Limit, len(policies))
			for i, p := range policies {
				limits[i] = sluice.Limit{Policy: p, Cost: 2}
			}
			out := make([]sluice.Decision, len(limits))
			if ok, err := s.DecideAll(bg, fmt.Sprintf("acl-all-%d", round), limits, out); err != nil || !ok {
				t.Fatalf("round %d, DecideAll as the ACL user: %v %v %+v", round, ok, err, out)
			}
			// A concurrency limit beside a rate limit (lua/conc.lua), renewed and released (lua/lease.lua).
			conc := sluice.Policy{Name: "conc", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
			key := fmt.Sprintf("acl-conc-%d", round)
			if ok, err := s.DecideAll(bg, key, []sluice.Limit{{Policy: policies[0], Cost: 1}, {Policy: conc, Cost: 1, Lease: 7}}, out[:2]); err != nil || !ok {
				t.Fatalf("round %d, a concurrency limit as the ACL user: %v %v %+v", round, ok, err, out[:2])
			}
			if err := s.Renew(bg, key, conc, 7); err != nil {
				t.Fatalf("round %d, Renew as the ACL user: %v", round, err)
			}
			if err := s.Release(bg, key, conc, 7); err != nil {
				t.Fatalf("round %d, Release as the ACL user: %v", round, err)
			}
			// Batching is on, and a batch of several (lua/batch.lua) runs as the ACL user.
			if c.batch == nil {
				t.Fatal("the store does not batch as the ACL user")
			}
			var batch []*call
			for i, p := range policies {
				hash, log := s.keys(fmt.Sprintf("acl-batch-%d", round), p.Name) // one client: one slot
				args := [5]string{fmt.Sprint(int(p.Algorithm)), fmt.Sprint(p.Limit), fmt.Sprint(p.PeriodMicros()), fmt.Sprint(p.Burst), "1"}
				batch = append(batch, newCall(fmt.Sprintf("acl-batch-%d", round), &p, 1, hash, log, args, 0, time.Now(), time.Now().Add(5*time.Second)))
				_ = i
			}
			(&worker{b: c.batch}).send(batch)
			for i, call := range batch {
				if call.err != nil || call.reply[0] != 1 {
					t.Fatalf("round %d, a batch as the ACL user: decision %d: %v %v", round, i, call.reply, call.err)
				}
			}
		}
	}

	singleServer := func(t *testing.T) {
		srv := redistest.Start(t, "--requirepass", "default-secret")
		admin := func(args ...string) (string, error) { return srv.DoAuth("default-secret", args...) }
		setUser(t, admin)
		var logged strings.Builder // (New logs before it returns; nothing logs after)
		s, err := New(Options{URL: "redis://sluice:s3cret@" + srv.Addr + "/2", Timeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
		if err != nil {
			t.Fatalf("New as the ACL user: %v", err)
		}
		defer s.Close()
		if said := strings.Contains(logged.String(), "does not take the store's function library"); said != (rules != ACLRules) {
			t.Errorf("logged %q; want the scripts' use said if and only if the rules refuse Functions", logged.String())
		}
		check(t, s, func() {
			for _, flush := range [][]string{{"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
				if _, err := admin(flush...); err != nil {
					t.Fatal(err)
				}
			}
		})
		if n, err := admin("SELECT", "2"); err != nil || n != "OK" {
			t.Fatal(n, err)
		}
		// No wider than needed.
		c := s.conn.Load().client
		for _, cmd := range [][]string{{"FLUSHALL"}, {"CONFIG", "GET", "maxmemory"}, {"GET", "other:key"}, {"KEYS", "*"}, {"SCRIPT", "FLUSH"},
			{"FUNCTION", "FLUSH"}, {"FUNCTION", "DELETE", library.name}, {"FUNCTION", "LIST"}} {
			if err := c.Do(context.Background(), c.B().Arbitrary(cmd...).Build()).Error(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("the ACL user may run %q: %v; want NOPERM", cmd, err)
			}
		}
	}
	t.Run("single-server", singleServer)
	// The rules before the library: FUNCTION LOAD is refused at connection, and the store runs
	// the scripts (funcs.go).
	rules = strings.Replace(ACLRules, "+fcall +function|load ", "", 1)
	t.Run("single-server-without-functions", singleServer)
	rules = ACLRules

	t.Run("cluster", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		for _, srv := range cluster.Servers {
			setUser(t, srv.Do)
		}
		s, err := New(Options{Addrs: cluster.Addrs(), Username: "sluice", Password: "s3cret", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("New on the cluster as the ACL user: %v", err)
		}
		defer s.Close()
		if c := s.conn.Load(); c == nil || !c.cluster {
			t.Fatal("not connected as a cluster client")
		}
		check(t, s, func() {
			for _, srv := range cluster.Servers {
				for _, flush := range [][]string{{"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
					if _, err := srv.Do(flush...); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
		// The keys spread over the masters: every node served the ACL user.
		for _, srv := range cluster.Servers {
			if n, err := srv.Do("DBSIZE"); err != nil || n == "0" {
				t.Errorf("master %s holds %s keys (%v); want some", srv.Addr, n, err)
			}
		}
	})
}

var bg = context.Background()
