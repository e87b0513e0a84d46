package peertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/redistest"
)

// startPeer starts a redis-server and the peer on it with every sequence's files, and returns a
// client of the peer and a reset that flushes the Redis.
func startPeer(t *testing.T) (*Client, func() error) {
	t.Helper()
	redis := redistest.Start(t)
	addr := Start(t, redis.Addr, ConfigFiles(t, Sequences()...)...)
	flush := func() error {
		if r, err := redis.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	return NewClient(t, addr), flush
}

// TestPeerPassesItsOwnSequences proves the recorded answers: the real peer, at Version, on a real
// redis-server, gives every one of them.
func TestPeerPassesItsOwnSequences(t *testing.T) {
	c, flush := startPeer(t)
	for _, s := range Sequences() {
		t.Run(s.Name, func(t *testing.T) { Check(t, s, c, flush) })
	}
}

// TestRunReportsDifferences proves that the comparison catches what it is for: a sequence whose
// recorded answers are wrong in every field reports each, by step, descriptor and field.
func TestRunReportsDifferences(t *testing.T) {
	c, flush := startPeer(t)
	l := lim(50, Second)
	s := Sequence{Name: "wrong", Configs: []string{"basic.yaml"}, Steps: []Step{
		step("wrong remaining", one("basic", "key1", "a"), answer(ok(l, 48))),
		step("wrong code", one("basic", "key1", "a"), answer(over(l))),
		step("no reset wanted", one("basic", "key1", "a"), answer(Status{Code: OK, Limit: l, Remaining: 47, NoReset: true})),
		step("a limit where there is none", one("foo", "x", "y"), answer(ok(l, 0))),
		step("two statuses for one descriptor", one("foo", "x", "y"), answer(noLimit, noLimit)),
		step("an error wanted", one("foo", "x", "y"), Want{Err: codes.InvalidArgument}),
		step("the wrong error", one("", "x", "y"), Want{Err: codes.InvalidArgument}),
		step("no error wanted", one("", "x", "y"), answer(noLimit)),
		step("a name wanted", one("basic", "key1", "b"), answer(ok(named(50, Second, "n"), 49))),
		// A year's window: its end is not a second away (unless the test runs in a year's last seconds).
		step("the wrong unit", one("basic", "key1", "c"), answer(ok(lim(50, Year), 49))),
	}}
	res := s.Run(context.Background(), c, flush)
	var got []string
	for _, d := range res.Diffs {
		got = append(got, fmt.Sprintf("%d/%d/%s", d.Step, d.Descriptor, d.Field))
	}
	want := []string{
		"1/0/limit_remaining",
		"2/-1/overall_code", "2/0/code", "2/0/limit_remaining",
		"3/0/duration_until_reset",
		"4/0/current_limit", "4/0/duration_until_reset",
		"5/-1/number of statuses",
		"6/-1/error", "7/-1/error", "8/-1/error",
		"9/0/current_limit",
		"10/0/current_limit", "10/0/duration_until_reset",
	}
	if !slices.Equal(got, want) {
		t.Errorf("differences:\n got %v\nwant %v", got, want)
	}
	for _, d := range res.Diffs {
		t.Log(d)
	}
	// The report names the step, its note, the descriptor, the field, both values and the request.
	if first := res.Diffs[0].String(); !strings.Contains(first, `step 1 (wrong remaining): descriptor 0: limit_remaining: want 48, got 49`) ||
		!strings.Contains(first, `request: domain "basic" [key1=a]`) {
		t.Errorf("first difference reads %q", first)
	}
	if res.Attempts == 2 && res.Retried == "" {
		t.Error("two attempts without a reason")
	}
}

func TestRunReportsAFailingReset(t *testing.T) {
	c, _ := startPeer(t)
	res := Sequences()[0].Run(context.Background(), c, func() error { return fmt.Errorf("no store") })
	if len(res.Diffs) != 1 || !strings.Contains(res.Diffs[0].String(), "resetting the store: want no error, got no store") {
		t.Fatalf("diffs %v", res.Diffs)
	}
}

// TestSequencesAreWellFormed checks the data itself: unique names, files that exist and are
// loaded by the peer test (each domain once), one status per descriptor.
func TestSequencesAreWellFormed(t *testing.T) {
	names := map[string]bool{}
	for _, s := range Sequences() {
		if names[s.Name] {
			t.Errorf("two sequences named %s", s.Name)
		}
		names[s.Name] = true
		if s.About == "" || len(s.Configs) == 0 || len(s.Steps) == 0 {
			t.Errorf("%s: About, Configs and Steps are required", s.Name)
		}
		for _, n := range s.Configs {
			if _, err := testdata.ReadFile("testdata/" + n); err != nil {
				t.Errorf("%s: %v", s.Name, err)
			}
		}
		for i, st := range s.Steps {
			if st.Want.Err == codes.OK && len(st.Want.Statuses) != len(st.Req.Descriptors) {
				t.Errorf("%s step %d: %d statuses for %d descriptors", s.Name, i+1, len(st.Want.Statuses), len(st.Req.Descriptors))
			}
		}
	}
	// Every file in testdata/ is some sequence's.
	entries, err := testdata.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range ConfigFiles(t, Sequences()...) {
		used[filepath.Base(p)] = true
	}
	for _, e := range entries {
		if !used[e.Name()] {
			t.Errorf("testdata/%s is no sequence's", e.Name())
		}
	}
}

func TestResetFits(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		unit   Unit
		t0, t1 string
		d      time.Duration
		fits   bool
	}{
		{Minute, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", 30 * time.Second, true}, // the peer: 60 - 30
		{Minute, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", 29750 * time.Millisecond, true},
		{Minute, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", 28 * time.Second, false},
		{Minute, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", 61 * time.Second, false},
		{Minute, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", 0, false},
		{Second, "2026-03-04T10:20:30.250Z", "2026-03-04T10:20:30.260Z", time.Second, true},
		{Hour, "2026-03-04T10:59:59.900Z", "2026-03-04T11:00:00.100Z", time.Hour, true}, // across the boundary
		{Hour, "2026-03-04T10:59:59.900Z", "2026-03-04T11:00:00.100Z", time.Second, true},
		// Weeks start on Thursdays (1970-01-01 was one): from Wednesday 2026-03-04 00:00 UTC, one day.
		{Week, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 24 * time.Hour, true},
		{Week, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 5 * 24 * time.Hour, false},
		// 30-day months from the epoch: 2026-03-04 is day 20516, and 20516 mod 30 = 26: 4 days left.
		{Month, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 4 * 24 * time.Hour, true},
		{Month, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 27 * 24 * time.Hour, false},
		// 365-day years: 20516 mod 365 = 76: 289 days left.
		{Year, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 289 * 24 * time.Hour, true},
		{Year, "2026-03-04T00:00:00.100Z", "2026-03-04T00:00:00.200Z", 302 * 24 * time.Hour, false},
	} {
		want, fits := resetFits(c.unit, durationpb.New(c.d), at(c.t0), at(c.t1))
		if fits != c.fits {
			t.Errorf("%v window, %s..%s, %v: fits %v, want %v (%s)", c.unit, c.t0, c.t1, c.d, fits, c.fits, want)
		}
	}
}

func TestCrossed(t *testing.T) {
	s := Sequence{Steps: []Step{step("", one("d", "k", "v"), answer(ok(lim(1, Minute), 0))), step("", one("d", "k", "v"), answer(noLimit))}}
	base := time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC)
	if _, crossed := s.crossed(base.Add(time.Second), base.Add(59*time.Second)); crossed {
		t.Error("within a minute: crossed")
	}
	if u, crossed := s.crossed(base.Add(-time.Millisecond), base.Add(time.Millisecond)); !crossed || u != Minute {
		t.Errorf("across a minute's start: %v %v", u, crossed)
	}
	// A second's start does not matter to a sequence that counts only in minutes.
	if _, crossed := s.crossed(base.Add(1500*time.Millisecond), base.Add(2500*time.Millisecond)); crossed {
		t.Error("across a second's start: crossed")
	}
}

// TestRunRetriesAcrossABoundary: an attempt that differs while a window of a unit the sequence
// counts in starts runs once more; one that differs within a window does not.
func TestRunRetriesAcrossABoundary(t *testing.T) {
	c, flush := startPeer(t)
	wrong := Sequence{Name: "wrong", Configs: []string{"basic.yaml"}, Steps: []Step{
		step("wrong remaining", one("basic", "key1", "a"), answer(ok(lim(50, Second), 10))),
	}}
	defer func() { windowClock = time.Now }()
	base := time.Date(2026, 3, 4, 10, 20, 30, 0, time.UTC)
	var reads int
	windowClock = func() time.Time { reads++; return base.Add(time.Duration(reads) * 400 * time.Millisecond) } // 30.4, 30.8: one second
	if res := wrong.Run(context.Background(), c, flush); res.Attempts != 1 || res.Retried != "" || len(res.Diffs) != 1 {
		t.Errorf("within a second: %+v", res)
	}
	reads = 1 // 30.8, then 31.2: a new second
	res := wrong.Run(context.Background(), c, flush)
	if res.Attempts != 2 || !strings.Contains(res.Retried, "second window") || len(res.Diffs) != 1 {
		t.Errorf("across a second's start: %+v", res)
	}
	// A sequence that matches runs once, boundary or not.
	reads = 1
	if res := Sequences()[0].Run(context.Background(), c, flush); res.Attempts != 1 || len(res.Diffs) != 0 {
		t.Errorf("a matching sequence: %+v", res)
	}
}

// failTB records a Fatalf and ends the goroutine, as testing.T does, so that a test can see a
// helper fail.
type failTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *failTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *failTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

// TestStartFailsOnABadFile: a file the peer does not load fails Start at once, with the peer's
// own error, naming the file and the problem.
func TestStartFailsOnABadFile(t *testing.T) {
	redis := redistest.Start(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &failTB{TB: t}
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); Start(f, redis.Addr, bad) }()
	<-done
	t.Log(f.msg)
	if !strings.Contains(f.msg, "did not become healthy") || !strings.Contains(f.msg, "invalid rate limit unit 'fortnight'") {
		t.Errorf("Start's failure: %s", f.msg)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("Start took %v to fail", time.Since(start))
	}
}

// TestBinaryFailsClearlyWithoutTheProxy: with no module proxy and an empty module cache, Binary
// fails the test (it does not skip it), saying what it ran and what it needs.
func TestBinaryFailsClearlyWithoutTheProxy(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("GOMODCACHE", t.TempDir())
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-modcacherw")
	f := &failTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); Binary(f) }()
	<-done
	for _, want := range []string{"building the peer", Package + "@" + Version, "GOPROXY=off", "needs the Go module proxy"} {
		if !strings.Contains(f.msg, want) {
			t.Errorf("Binary's failure does not say %q: %s", want, f.msg)
		}
	}
	t.Log(f.msg)
}
