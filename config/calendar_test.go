package config

import (
	"testing"

	"github.com/sluicehq/sluice"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo
)

// cal is a policy named at line 3 whose other fields are given, one per line from line 4 on.
func cal(fields string) string {
	return up + "policies:\n  - name: daily\n" + fields
}

// calendar and time_zone's errors, each at its line. They join errorCases, so that TestErrors
// checks them and FuzzParse starts from them.
var calendarErrorCases = []struct {
	name string
	yaml string
	want []wantErr
}{
	{"calendar: with a period", cal("    algorithm: fixed-window\n    limit: 10\n    period: 24h\n    calendar: day\n"),
		[]wantErr{at(6, `policies[0] "daily": period and calendar exclude each other`)}},
	{"calendar: on a token bucket", cal("    algorithm: token-bucket\n    limit: 10\n    calendar: day\n"),
		[]wantErr{at(6, "calendar has no meaning for token-bucket: only fixed-window and sliding-window")}},
	{"calendar: on a sliding log", cal("    algorithm: sliding-log\n    limit: 10\n    calendar: month\n"),
		[]wantErr{at(6, "calendar has no meaning for sliding-log")}},
	{"calendar: unknown", cal("    algorithm: fixed-window\n    limit: 10\n    calendar: fortnight\n"),
		[]wantErr{at(6, `calendar "fortnight" is unknown (want day, week, month or year)`)}},
	{"calendar: not a string", cal("    algorithm: fixed-window\n    limit: 10\n    calendar: [day]\n"),
		[]wantErr{at(6, "calendar must be a string")}},
	{"time_zone: without a calendar", cal("    algorithm: fixed-window\n    limit: 10\n    period: 1h\n    time_zone: Europe/Berlin\n"),
		[]wantErr{at(7, "time_zone has no meaning without calendar")}},
	{"time_zone: unknown", cal("    algorithm: fixed-window\n    limit: 10\n    calendar: day\n    time_zone: Europe/Berln\n"),
		[]wantErr{at(7, `policies[0] "daily": time_zone "Europe/Berln" is not a known IANA time zone`)}},
	{"time_zone: this machine's", cal("    algorithm: sliding-window\n    limit: 10\n    calendar: week\n    time_zone: Local\n"),
		[]wantErr{at(7, `time_zone "Local" is not a zone name`)}},
	{"time_zone: empty", cal("    algorithm: sliding-window\n    limit: 10\n    calendar: week\n    time_zone: \"\"\n"),
		[]wantErr{at(7, `time_zone "" is not a zone name`)}},
	{"time_zone: a path", cal("    algorithm: sliding-window\n    limit: 10\n    calendar: week\n    time_zone: ../../etc/passwd\n"),
		[]wantErr{at(7, "is not a known IANA time zone")}},
	{"calendar: neither it nor a period", cal("    algorithm: fixed-window\n    limit: 10\n"),
		[]wantErr{at(3, "period is required (e.g. 1s, 1m, 24h), or calendar (day, week, month or year)")}},
	{"calendar: with a burst", cal("    algorithm: fixed-window\n    limit: 10\n    calendar: day\n    burst: 5\n"),
		[]wantErr{at(7, "burst 5 has no meaning for fixed-window")}},
	{"calendar: several problems at once", cal("    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    calendar: day\n    time_zone: Mars/Olympus\n"),
		[]wantErr{at(6, "period and calendar exclude each other"), at(7, "calendar has no meaning for token-bucket"), at(8, "not a known IANA time zone")}},
}

func init() {
	errorCases = append(errorCases, calendarErrorCases...)
}

func TestCalendarPolicies(t *testing.T) {
	cfg, err := parseTest(t, up+`policies:
  - {name: daily, algorithm: fixed-window, limit: 10000, calendar: day, time_zone: Europe/Berlin}
  - {name: monthly, algorithm: sliding-window, limit: 1000000, calendar: month}
  - {name: weekly, algorithm: fixed-window, limit: 50, calendar: week, time_zone: America/New_York, local_budget: {size: 5, max_age: 1s}}
default_policy: [daily, monthly, weekly]
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cal  sluice.Calendar
		zone string
	}{{"daily", sluice.Day, "Europe/Berlin"}, {"monthly", sluice.Month, "UTC"}, {"weekly", sluice.Week, "America/New_York"}} {
		p, ok := cfg.Policy(c.name)
		if !ok {
			t.Fatalf("no policy %q", c.name)
		}
		if p.Calendar != c.cal || p.Location.String() != c.zone || p.Period != 0 || p.Validate() != nil {
			t.Errorf("%s: calendar %v in %v, period %v: %v", c.name, p.Calendar, p.Location, p.Period, p.Validate())
		}
	}
}
