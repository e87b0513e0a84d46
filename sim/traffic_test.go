package sim

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const ms, sec = int64(1000), int64(1_000_000)

// times returns the request times of reqs, checking that each has key "k" and cost 1.
func times(t *testing.T, reqs []Request) []int64 {
	t.Helper()
	ts := make([]int64, len(reqs))
	for i, r := range reqs {
		if r.Key != DefaultKey || r.Cost != 1 {
			t.Fatalf("request %d = %+v, want key %q and cost 1", i, r, DefaultKey)
		}
		ts[i] = r.TMicros
	}
	return ts
}

func evenly(n int, start, step int64) []int64 {
	ts := make([]int64, n)
	for i := range ts {
		ts[i] = start + int64(i)*step
	}
	return ts
}

func concat(parts ...[]int64) []int64 {
	var all []int64
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func TestParseTrafficTimes(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		want    []int64 // µs
	}{
		{"5/s for 10s", evenly(50, 0, 200*ms)},
		{"40 in 1s", evenly(40, 0, 25*ms)},
		{"3 at once", []int64{0, 0, 0}},
		{"5/s for 10s; 40 in 1s; 5/s for 10s", concat(evenly(50, 0, 200*ms), evenly(40, 10*sec, 25*ms), evenly(50, 11*sec, 200*ms))},
		{"0.5/s for 5s", []int64{0, 2 * sec, 4 * sec}},
		{"20/min for 10s", []int64{0, 3 * sec, 6 * sec, 9 * sec}},
		{"7/min for 20s", []int64{0, 8571428, 17142857}}, // 60/7 s, exactly: no float
		{"2/h for 1h", []int64{0, 1800 * sec}},
		{"300 / min for 1s", evenly(5, 0, 200*ms)},
		{"0.5/s for 4s", []int64{0, 2 * sec}}, // 4s is the segment's end, not in it
		{"3/s for 1s", []int64{0, 333333, 666666}},
		{"1.5/s for 2s", []int64{0, 666666, 1333333}},
		{"0.001/s for 1000s", []int64{0}},
		{"0.001/s for 1000.000001s", []int64{0, 1000 * sec}},
		{"3 in 1s", []int64{0, 333333, 666666}},
		{"4 in 3us", []int64{0, 0, 1, 2}},
		{"2 at once; idle 1s; 2 in 1s; 1 at once", []int64{0, 0, sec, sec + 500*ms, 2 * sec}},
		{"idle 2s; 2 at once", []int64{2 * sec, 2 * sec}},
		{"  5 / s   for 1s ;; 2 at once ;  ", concat(evenly(5, 0, 200*ms), []int64{sec, sec})},
	} {
		reqs, err := ParseTraffic(tc.pattern)
		if err != nil {
			t.Errorf("ParseTraffic(%q): %v", tc.pattern, err)
			continue
		}
		got := times(t, reqs)
		if !slices.Equal(got, tc.want) {
			t.Errorf("ParseTraffic(%q) times = %v, want %v", tc.pattern, got, tc.want)
		}
	}
}

func TestParseTrafficIdleOnly(t *testing.T) {
	reqs, err := ParseTraffic("idle 10s")
	if err != nil || len(reqs) != 0 {
		t.Fatalf(`ParseTraffic("idle 10s") = %v, %v; want no requests and no error`, reqs, err)
	}
}

func TestParseTrafficLarge(t *testing.T) {
	reqs, err := ParseTraffic("1000/s for 10m; 1000 in 1ms")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 601000 {
		t.Fatalf("got %d requests, want 601000", len(reqs))
	}
	if got, want := reqs[599999].TMicros, int64(599999*ms); got != want {
		t.Errorf("request 599999 at %d µs, want %d", got, want)
	}
	if got, want := reqs[600999].TMicros, 600*sec+999; got != want {
		t.Errorf("last request at %d µs, want %d", got, want)
	}
}

func TestParseTrafficErrors(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		want    []string // substrings of the error
	}{
		{"", []string{"empty"}},
		{" ; ", []string{"empty"}},
		{"40 in", []string{`traffic segment 1 "40 in": want "R/s for D", "N in D", "N at once" or "idle D"`}},
		{"5/s for 10s; 40 in", []string{`traffic segment 2 "40 in": want`}},
		{"5/s for 10s;; 40 in", []string{`traffic segment 3 "40 in"`}},
		{"5 per second", []string{`segment 1 "5 per second": want`}},
		{"5/m for 1s", []string{"want"}},
		{"idle", []string{"want"}},
		{"1m30s", []string{"want"}},
		{"0/s for 1s", []string{"rate 0/s must be > 0"}},
		{"0.000/s for 1s", []string{"must be > 0"}},
		{"-5/s for 1s", []string{`rate "-5" is not a non-negative decimal`}},
		{"5.1234/s for 1s", []string{`rate "5.1234" has more than 3 decimals`}},
		{"x/s for 1s", []string{`rate "x"`}},
		{"0 in 1s", []string{"count 0 must be > 0"}},
		{"-3 at once", []string{"count -3 must be > 0"}},
		{"2.5 at once", []string{`count "2.5" is not a whole number`}},
		{"5 in 0s", []string{"duration 0s must be > 0"}},
		{"5 in -1s", []string{"duration -1s must be > 0"}},
		{"5 in 10q", []string{`duration "10q" is not a Go duration`}},
		{"5/s for 1500ns", []string{"whole number of microseconds"}},
		{"idle 0s; 1 at once", []string{`segment 1 "idle 0s"`, "must be > 0"}},
		{"2000000 at once", []string{"more than the 1000000 requests"}},
		{"99999999999999999999 at once", []string{"more than the 1000000 requests"}},
		{"600000 at once; 600000 in 1s", []string{`segment 2 "600000 in 1s"`, "more than 1000000 requests"}},
		{"1000000/s for 2s", []string{"more than"}},
		{"999999999/s for 2000000h", []string{"more than"}},
		{"idle 2000000h; 1 in 1000000h", []string{`segment 2`, "285 years"}},
	} {
		_, err := ParseTraffic(tc.pattern)
		if err == nil {
			t.Errorf("ParseTraffic(%q): no error, want one containing %q", tc.pattern, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseTraffic(%q) error %q does not contain %q", tc.pattern, err, w)
			}
		}
	}
}

func TestParseThousandths(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"12", 12000, ""},
		{"0.5", 500, ""},
		{".5", 500, ""},
		{"1.001", 1001, ""},
		{"1.2000", 1200, ""},
		{"007.250", 7250, ""},
		{"1.2345", 0, "more than 3 decimals"},
		{"1.", 0, "not a non-negative decimal"},
		{".", 0, "not a non-negative decimal"},
		{"", 0, "not a non-negative decimal"},
		{"1e3", 0, "not a non-negative decimal"},
		{"+1", 0, "not a non-negative decimal"},
		{"1,5", 0, "not a non-negative decimal"},
		{"9007199254740.992", 9007199254740992, ""},
		{"9007199254740.993", 0, "too large"},
		{"99999999999999999999999", 0, "too large"},
	} {
		got, err := parseThousandths(tc.in, MaxTimeMicros)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("parseThousandths(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseThousandths(%q) = %d, %v; want an error containing %q", tc.in, got, err, tc.err)
		}
	}
}

func TestNormalizePattern(t *testing.T) {
	for in, want := range map[string]string{
		"5/s for 10s;40 in 1s":               "5/s for 10s; 40 in 1s",
		"  5/s   for\t10s ;; 40  at once ; ": "5/s for 10s; 40 at once",
		"":                                   "",
		" ; ":                                "",
	} {
		if got := NormalizePattern(in); got != want {
			t.Errorf("NormalizePattern(%q) = %q, want %q", in, got, want)
		}
	}
}

// matchForm reads a segment as the regular expressions of its forms do: the same submatches
// for the forms' texts and for random texts of their words, whitespace and punctuation.
func TestMatchFormIsTheRegexps(t *testing.T) {
	forms := map[string]*regexp.Regexp{
		"rate": regexp.MustCompile(`^([^\s/]+)\s*/\s*(s|min|h)\s+for\s+(\S+)$`),
		"in":   regexp.MustCompile(`^(\S+)\s+in\s+(\S+)$`),
		"once": regexp.MustCompile(`^(\S+)\s+at\s+once$`),
		"idle": regexp.MustCompile(`^idle\s+(\S+)$`),
	}
	texts := []string{"5/s for 10s", "5 / s for 10s", "5/ min  for\t1m", "0.5/h for 2h", "5/sfor 10s", "5/s for 1/s",
		"5/d for 1s", "/s for 1s", "a b/s for 1s", "40 in 1s", "40  in\f1s", "in in in", "20 at once", "20 at  once x",
		"idle 5s", "idle in 5s", "idle\v5s", "5/s for\v10s", "5\v/s for 1s", "idle", "at once"}
	parts := []string{"5", "0.5", "/", "s", "min", "h", "for", "in", "at", "once", "idle", "10s", " ", "  ", "\t", "\v", "\u00a0", "x/y"}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(8) + 1 {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		texts = append(texts, b.String())
	}
	for _, text := range texts {
		text = strings.TrimSpace(text) // as ParseTraffic gives it
		for name, re := range forms {
			if want, got := re.FindStringSubmatch(text), matchForm(text, name); !slices.Equal(got, want) {
				t.Fatalf("%s form of %q: %q, the regexp %q", name, text, got, want)
			}
		}
	}
}
