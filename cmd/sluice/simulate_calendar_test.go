package main

import (
	"encoding/csv"
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// berlinNight is the night before Berlin's 23-hour day, 2026-03-29, an hour before midnight.
var berlinNight = []string{"--calendar", "day", "--time-zone", "Europe/Berlin", "--start", "2026-03-28T23:00:00+01:00"}

// The table of a calendar simulation names the calendar, shows each row's local time, and marks
// where a new window begins: the 29th lasts 23 hours, and 02:00 does not happen.
func TestSimulateCalendarTable(t *testing.T) {
	out := ok(t, "", slices.Concat([]string{"simulate", "--algorithm", "fixed-window", "--limit", "3", "--traffic", "4 at once; idle 1h; 4 at once; idle 23h; 1 at once"}, berlinNight)...)
	for _, re := range []string{
		`(?m)^sluice simulate: fixed-window, limit 3 per day in Europe/Berlin$`,
		`(?m)^policy: at most 3 in each day in Europe/Berlin \(from local midnight to midnight\)$`,
		`(?m)^start: t=0 is Sat 2026-03-28 23:00:00 \+01:00 \(CET\)$`,
		`(?m)^ +0s +Sat 2026-03-28 23:00:00 \+01:00 +day 2026-03-28, 24h +4 +3 +1$`,
		`(?m)^ +1h +Sun 2026-03-29 00:00:00 \+01:00 +new day 2026-03-29, 23h +4 +3 +1$`,
		`(?m)^ +3h +Sun 2026-03-29 03:00:00 \+02:00 +0 +0 +0$`,
		`(?m)^ +24h +Mon 2026-03-30 00:00:00 \+02:00 +new day 2026-03-30, 24h +1 +1 +0$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("the table lacks %s:\n%s", re, out)
		}
	}

	// --compare: the two algorithms with a calendar, and it says so.
	out = ok(t, "", slices.Concat([]string{"simulate", "--compare", "--limit", "3", "--traffic", "4 at once; idle 1h; 4 at once"}, berlinNight)...)
	if !strings.Contains(out, "sluice simulate --compare: limit 3 per day in Europe/Berlin: fixed-window and sliding-window only (the other algorithms have no calendar)\n") ||
		!regexp.MustCompile(`(?m)^fixed-window +8 +6 `).MatchString(out) || !regexp.MustCompile(`(?m)^sliding-window +8 +3 `).MatchString(out) ||
		strings.Contains(out, "token-bucket") {
		t.Errorf("--compare --calendar:\n%s", out)
	}
}

// CSV and JSON give each row's local time and the start of its window; t_ms counts from --start.
func TestSimulateCalendarCSVAndJSON(t *testing.T) {
	args := []string{"simulate", "--algorithm", "sliding-window", "--limit", "10", "--calendar", "day", "--time-zone", "Europe/Berlin",
		"--start", "2026-10-24T12:00:00+02:00", "--trace", "-"}
	// 10 at noon on the 24th; on the 25th (25 hours) they weigh 10·(25h - e)/25h.
	trace := "t_ms,cost\n0,10\n0,1\n" + "88200000,0\n"
	out := ok(t, trace, append(args, "--format", "csv")...)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"t_ms", "key", "cost", "allowed", "remaining", "retry_after_ms", "delay_ms", "time", "window"},
		{"0", "k", "10", "true", "0", "0", "0", "2026-10-24T12:00:00+02:00", "2026-10-24T00:00:00+02:00"},
		{"0", "k", "1", "false", "0", "52200000", "0", "2026-10-24T12:00:00+02:00", "2026-10-24T00:00:00+02:00"}, // 12h + 2.5h
		{"88200000", "k", "0", "true", "5", "0", "0", "2026-10-25T11:30:00+01:00", "2026-10-25T00:00:00+02:00"},  // 12.5h of 25h
	}
	if !slices.EqualFunc(recs, want, slices.Equal) {
		t.Errorf("CSV:\n%q\nwant\n%q", recs, want)
	}

	out = ok(t, trace, append(args, "--format", "json")...)
	var doc struct {
		Start    string           `json:"start"`
		Policy   map[string]any   `json:"policy"`
		Requests []map[string]any `json:"requests"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Start != "2026-10-24T12:00:00+02:00" || doc.Policy["calendar"] != "day" || doc.Policy["time_zone"] != "Europe/Berlin" || doc.Policy["period_ms"] != nil {
		t.Errorf("start %q, policy %v", doc.Start, doc.Policy)
	}
	if r := doc.Requests[2]; r["time"] != "2026-10-25T11:30:00+01:00" || r["window"] != "2026-10-25T00:00:00+02:00" || r["remaining"] != 5.0 {
		t.Errorf("request 3: %v", r)
	}

	// --start alone: local times in its offset, no window.
	out = ok(t, "", "simulate", "--algorithm", "token-bucket", "--limit", "1", "--period", "1s", "--start", "2026-01-01T00:00:00.5+05:30", "--traffic", "2 at once", "--format", "csv")
	if lines := strings.Split(out, "\n"); lines[0] != "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,time" || lines[2] != "0,k,1,false,0,1000,0,2026-01-01T00:00:00.5+05:30" {
		t.Errorf("--start alone:\n%s", out)
	}
}

func TestSimulateCalendarBadFlags(t *testing.T) {
	base := []string{"simulate", "--limit", "5", "--traffic", "5/s for 2s"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown calendar", []string{"--algorithm", "fixed-window", "--calendar", "fortnight"}, "--calendar fortnight: want day, week, month or year"},
		{"calendar and period", []string{"--algorithm", "fixed-window", "--calendar", "day", "--period", "1s"}, "--calendar day and --period 1s exclude each other"},
		{"calendar on a bucket", []string{"--algorithm", "token-bucket", "--calendar", "day"}, "--calendar day: token-bucket has no calendar (only fixed-window and sliding-window"},
		{"calendar on a log", []string{"--algorithm", "sliding-log", "--calendar", "week"}, "sliding-log has no calendar"},
		{"calendar with a burst", []string{"--algorithm", "fixed-window", "--calendar", "day", "--burst", "3"}, "--burst 3: fixed-window takes no burst"},
		{"compare calendar with a burst", []string{"--compare", "--calendar", "day", "--burst", "3"}, "--burst 3: with --calendar, --compare runs fixed-window and sliding-window"},
		{"calendar without an algorithm", []string{"--calendar", "day"}, "--algorithm is required (fixed-window or sliding-window"},
		{"zone without a calendar", []string{"--algorithm", "fixed-window", "--period", "1s", "--time-zone", "Europe/Berlin"}, "--time-zone Europe/Berlin needs --calendar"},
		{"unknown zone", []string{"--algorithm", "fixed-window", "--calendar", "day", "--time-zone", "Europe/Berln"}, "--time-zone Europe/Berln: not a known IANA time zone"},
		{"local zone", []string{"--algorithm", "fixed-window", "--calendar", "day", "--time-zone", "Local"}, `--time-zone "Local": want a zone name`},
		{"bad start", []string{"--algorithm", "fixed-window", "--calendar", "day", "--start", "2026-03-29 00:00"}, "--start 2026-03-29 00:00: want an RFC 3339 time"},
		{"start below a µs", []string{"--algorithm", "fixed-window", "--period", "1s", "--start", "2026-03-29T00:00:00.0000001Z"}, "--start 2026-03-29T00:00:00.0000001Z: must be a whole number of microseconds"},
		{"period missing names the calendar", []string{"--algorithm", "fixed-window"}, "--period is required: the period of --limit, a Go duration such as 1s, 500ms or 1m (or --calendar day, week, month or year)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "", append(slices.Clone(base), tc.args...)...)
			if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "sluice: ") || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, one line with %q", code, stdout, stderr, tc.want)
			}
		})
	}
	// The help names the flags.
	out := ok(t, "", "simulate", "--help")
	for _, w := range []string{"--calendar", "--time-zone", "--start", "fixed-window and\nsliding-window only"} {
		if !strings.Contains(out, w) {
			t.Errorf("simulate --help lacks %q", w)
		}
	}
}

// sluice check takes calendar policies, and names the field and line of a bad one.
func TestCheckCalendar(t *testing.T) {
	for _, v := range []string{envConfig, envListen, envAdminListen} {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, checkHead+"policies:\n  - {name: daily, algorithm: fixed-window, limit: 10000, calendar: day, time_zone: Europe/Berlin}\n"+
		"  - {name: monthly, algorithm: sliding-window, limit: 1000000, calendar: month}\ndefault_policy: [daily, monthly]\n")
	if out := ok(t, "", "check", "--config", good); !strings.HasPrefix(out, good+": ok\n") {
		t.Errorf("check printed %q", out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, checkHead+"policies:\n  - name: daily\n    algorithm: fixed-window\n    limit: 10\n    calendar: day\n    time_zone: Europe/Berln\n")
	code, stdout, stderr := runCLI(t, "", "check", "--config", bad)
	if code != 2 || stdout != "" || !strings.Contains(stderr, bad+":9:") || !strings.Contains(stderr, `time_zone "Europe/Berln" is not a known IANA time zone`) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
