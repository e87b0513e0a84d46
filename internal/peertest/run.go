package peertest

import (
	"context"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Sequence is a series of requests and the answers the peer gives them, from a fresh store (no
// counters), against the peer's YAML files Configs (names in testdata/, see ConfigFiles).
type Sequence struct {
	Name    string   // a test name: "area/what"
	About   string   // the peer's behaviour it pins down
	Configs []string // the files it needs
	Steps   []Step
}

// Step is one request and its answer.
type Step struct {
	Note string // what the step shows, for the report of a difference
	Req  Request
	Want Want
}

// Want is the answer to a step.
type Want struct {
	// Err, when not codes.OK, is the gRPC status code the call fails with; then nothing else is
	// checked.
	Err      codes.Code
	Overall  Code
	Statuses []Status // one per descriptor, in order
}

// Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Limit is the current_limit: nil for none (no rule applied, an unlimited rule, or a replaced
	// one). With a Limit, duration_until_reset must be there, and end at the end of the limit's
	// current window (within a second: the peer counts in whole seconds); without, it must not.
	Limit     *Limit
	Remaining uint32
	// NoReset: the Limit is there but duration_until_reset is not (the peer's quota_mode answer
	// for a descriptor over its limit).
	NoReset bool
}

// Diff is one difference between an answer and the recorded one.
type Diff struct {
	Step       int // 1-based; 0 for none (resetting the store)
	Note       string
	Request    string
	Descriptor int // the status's index; -1 for the response as a whole
	Field      string
	Want, Got  string
}

func (d Diff) String() string {
	where := "before the first step"
	if d.Step > 0 {
		where = fmt.Sprintf("step %d", d.Step)
		if d.Note != "" {
			where += " (" + d.Note + ")"
		}
	}
	if d.Descriptor >= 0 {
		where += fmt.Sprintf(": descriptor %d", d.Descriptor)
	}
	s := fmt.Sprintf("%s: %s: want %s, got %s", where, d.Field, d.Want, d.Got)
	if d.Request != "" {
		s += "\n\trequest: " + d.Request
	}
	return s
}

// Result is the outcome of running a Sequence.
type Result struct {
	Diffs    []Diff // of the last attempt; none: every answer was the recorded one
	Attempts int    // 1, or 2 when the first attempt differed while crossing a window boundary
	Retried  string // why it ran a second time ("" if it did not)
}

// Run sends s's steps in order through c and compares every answer with the recorded one. reset,
// when not nil, is called before each attempt and must clear the server's counters (FLUSHALL on
// the Redis it uses); with nil the caller guarantees that no counter of s's descriptors exists.
//
// Fixed windows: a counter restarts at each window boundary of its unit (the start of every
// second, minute, ... counted from the Unix epoch), so counts that straddle one differ from the
// recorded ones for reasons that are no one's fault. Run notes the time before the first request
// and after the last; if the answers differed and some unit whose limit the sequence counts had a
// boundary between the two, it runs the sequence once more (after reset). The second attempt
// starts just after that boundary, so it has the whole window, and a sequence is far shorter than
// a second; a difference on the second attempt is real. Sequences whose counts matter over many
// requests use minute and longer units wherever the behaviour pinned down does not need seconds.
func (s Sequence) Run(ctx context.Context, c *Client, reset func() error) Result {
	var res Result
	for attempt := 1; attempt <= 2; attempt++ {
		res.Attempts = attempt
		if reset != nil {
			if err := reset(); err != nil {
				res.Diffs = []Diff{{Descriptor: -1, Field: "resetting the store", Want: "no error", Got: err.Error()}}
				return res
			}
		}
		start := windowClock()
		res.Diffs = s.attempt(ctx, c)
		end := windowClock()
		if len(res.Diffs) == 0 || attempt == 2 {
			return res
		}
		u, crossed := s.crossed(start, end)
		if !crossed {
			return res
		}
		res.Retried = fmt.Sprintf("the first attempt (%d differences) spanned the start of a new %s window", len(res.Diffs), strings.ToLower(u.String()))
	}
	return res
}

// windowClock is the time Run reads before and after an attempt (a test replaces it to cross a
// window boundary at will).
var windowClock = time.Now

// Check runs s against c (see Run) and fails tb with every difference.
func Check(tb testing.TB, s Sequence, c *Client, reset func() error) {
	tb.Helper()
	res := s.Run(context.Background(), c, reset)
	if res.Retried != "" {
		tb.Logf("%s: ran twice: %s", s.Name, res.Retried)
	}
	for _, d := range res.Diffs {
		tb.Errorf("%s: %v", s.Name, d)
	}
}

func (s Sequence) attempt(ctx context.Context, c *Client) []Diff {
	var diffs []Diff
	for i, st := range s.Steps {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		t0 := time.Now()
		resp, err := c.Send(callCtx, st.Req)
		t1 := time.Now()
		cancel()
		diffs = append(diffs, compare(i+1, st, resp, err, t0, t1, c.Extras)...)
	}
	return diffs
}

// crossed reports whether a window of one of the units s counts in started between start and end.
func (s Sequence) crossed(start, end time.Time) (Unit, bool) {
	var units []Unit
	for _, st := range s.Steps {
		for _, w := range st.Want.Statuses {
			if w.Limit != nil && !slices.Contains(units, w.Limit.Unit) {
				units = append(units, w.Limit.Unit)
			}
		}
	}
	for _, u := range units {
		if w := UnitSeconds[u]; w > 0 && start.Unix()/w != end.Unix()/w {
			return u, true
		}
	}
	return 0, false
}

func compare(step int, st Step, resp *rlspb.RateLimitResponse, err error, t0, t1 time.Time, extras bool) []Diff {
	var diffs []Diff
	add := func(desc int, field, want, got string) {
		diffs = append(diffs, Diff{Step: step, Note: st.Note, Request: st.Req.String(), Descriptor: desc, Field: field, Want: want, Got: got})
	}
	w := st.Want
	if w.Err != codes.OK {
		if err == nil {
			add(-1, "error", "gRPC status "+w.Err.String(), "an answer, overall_code "+resp.GetOverallCode().String())
		} else if got := status.Code(err); got != w.Err {
			add(-1, "error", "gRPC status "+w.Err.String(), err.Error())
		}
		return diffs
	}
	if err != nil {
		add(-1, "error", "none", err.Error())
		return diffs
	}
	if got := resp.GetOverallCode(); got != w.Overall {
		add(-1, "overall_code", w.Overall.String(), got.String())
	}
	if n := len(resp.GetResponseHeadersToAdd()); n > 0 && !extras {
		add(-1, "response_headers_to_add", "none", fmt.Sprint(resp.GetResponseHeadersToAdd()))
	}
	if n := len(resp.GetRequestHeadersToAdd()); n > 0 {
		add(-1, "request_headers_to_add", "none", fmt.Sprint(resp.GetRequestHeadersToAdd()))
	}
	if len(resp.GetRawBody()) > 0 && !extras {
		add(-1, "raw_body", "none", fmt.Sprintf("%q", resp.GetRawBody()))
	}
	if resp.GetDynamicMetadata() != nil {
		add(-1, "dynamic_metadata", "none", resp.GetDynamicMetadata().String())
	}
	if resp.GetQuota() != nil {
		add(-1, "quota", "none", resp.GetQuota().String())
	}
	got := resp.GetStatuses()
	if len(got) != len(w.Statuses) {
		add(-1, "number of statuses", fmt.Sprint(len(w.Statuses)), fmt.Sprint(len(got)))
	}
	for i := range min(len(got), len(w.Statuses)) {
		ws, gs := w.Statuses[i], got[i]
		if gs.GetCode() != ws.Code {
			add(i, "code", ws.Code.String(), gs.GetCode().String())
		}
		var gl *Limit
		if cl := gs.GetCurrentLimit(); cl != nil {
			gl = &Limit{RequestsPerUnit: cl.GetRequestsPerUnit(), Unit: cl.GetUnit(), Name: cl.GetName()}
		}
		if gl.String() != ws.Limit.String() {
			add(i, "current_limit", ws.Limit.String(), gl.String())
		}
		if gs.GetLimitRemaining() != ws.Remaining {
			add(i, "limit_remaining", fmt.Sprint(ws.Remaining), fmt.Sprint(gs.GetLimitRemaining()))
		}
		d := gs.GetDurationUntilReset()
		switch {
		case ws.Limit == nil || ws.NoReset:
			if d != nil {
				add(i, "duration_until_reset", "none", d.AsDuration().String())
			}
		case d == nil:
			add(i, "duration_until_reset", "the time to the end of the "+strings.ToLower(ws.Limit.Unit.String())+" window", "none")
		default:
			if want, ok := resetFits(ws.Limit.Unit, d, t0, t1); !ok {
				add(i, "duration_until_reset", want, d.AsDuration().String())
			}
		}
		if gs.GetQuota() != nil {
			add(i, "quota", "none", gs.GetQuota().String())
		}
	}
	return diffs
}

// resetFits reports whether d, answered by a server between t0 and t1, runs to the end of a
// window of unit u: some multiple E of the window (from the Unix epoch) with t0+d ≤ E+1s and
// E ≤ t1+d+1s (the peer counts in whole seconds: its d ends up to a second after E). If not, it
// returns what was expected.
func resetFits(u Unit, d *durationpb.Duration, t0, t1 time.Time) (string, bool) {
	w := UnitSeconds[u] * int64(time.Second)
	want := fmt.Sprintf("about %v, to the end of the current %s window",
		time.Duration(w-t0.UnixNano()%w).Round(time.Second), strings.ToLower(u.String()))
	dur := d.AsDuration()
	if w == 0 || dur <= 0 || int64(dur) > w {
		return want, false
	}
	lo := t0.UnixNano() + int64(dur) - int64(time.Second)
	hi := t1.UnixNano() + int64(dur) + int64(time.Second)
	e := (lo + w - 1) / w * w // the first boundary at or after lo
	return want, e <= hi
}

//go:embed testdata/*.yaml
var testdata embed.FS

// ConfigFiles writes the files that seqs need (every sequence's Configs, each once) into a fresh
// directory and returns their paths, for Start or for sluice's rls.envoy_config.
func ConfigFiles(tb testing.TB, seqs ...Sequence) []string {
	tb.Helper()
	var names []string
	for _, s := range seqs {
		for _, n := range s.Configs {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	dir := tb.TempDir()
	paths := make([]string, 0, len(names))
	for _, n := range names {
		data, err := testdata.ReadFile("testdata/" + n)
		if err != nil {
			tb.Fatalf("peertest: %s: %v", n, err)
		}
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			tb.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}
