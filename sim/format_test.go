package sim

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestFormatMillis(t *testing.T) {
	for us, want := range map[int64]string{
		0: "0", 1: "0.001", 10: "0.01", 200_000: "200", 6_800_000: "6800", 6_825_500: "6825.5",
		1_234_567: "1234.567", -1: "-0.001", -2_500: "-2.5", MaxTimeMicros: "9007199254740.992",
	} {
		if got := FormatMillis(us); got != want {
			t.Errorf("FormatMillis(%d) = %q, want %q", us, got, want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for us, want := range map[int64]string{
		0: "0s", 7 * sec: "7s", 6_825 * ms: "6.825s", 90 * sec: "1m30s", minute: "1m", hour: "1h",
		90 * minute: "1h30m", 250 * ms: "250ms", 3: "3µs", 3*hour + 5*sec: "3h0m5s",
	} {
		if got := FormatDuration(us); got != want {
			t.Errorf("FormatDuration(%d) = %q, want %q", us, got, want)
		}
	}
}

func TestRowSchema(t *testing.T) {
	for _, tc := range []struct {
		row  Row
		json string
		csv  []string
	}{
		{Row{Request: Request{TMicros: 10_025_000, Key: "k", Cost: 1}, Allowed: true, Remaining: 3, DelayMicros: 175_000},
			`{"t_ms":10025,"key":"k","cost":1,"allowed":true,"remaining":3,"retry_after_ms":0,"delay_ms":175}`,
			[]string{"10025", "k", "1", "true", "3", "0", "175"}},
		{Row{Request: Request{TMicros: 1, Key: `a,"b`, Cost: 2}, RetryAfterMicros: 999_999},
			`{"t_ms":0.001,"key":"a,\"b","cost":2,"allowed":false,"remaining":0,"retry_after_ms":999.999,"delay_ms":0}`,
			[]string{"0.001", `a,"b`, "2", "false", "0", "999.999", "0"}},
		{Row{Request: Request{TMicros: 5000, Key: "k", Cost: 9}, RetryAfterMicros: NeverMicros},
			`{"t_ms":5,"key":"k","cost":9,"allowed":false,"remaining":0,"retry_after_ms":-1,"delay_ms":0}`,
			[]string{"5", "k", "9", "false", "0", "-1", "0"}},
	} {
		b, err := json.Marshal(tc.row)
		if err != nil || string(b) != tc.json {
			t.Errorf("json.Marshal(%+v) = %s, %v\nwant %s", tc.row, b, err, tc.json)
		}
		if got := tc.row.CSVRecord(); !slices.Equal(got, tc.csv) {
			t.Errorf("CSVRecord(%+v) = %q, want %q", tc.row, got, tc.csv)
		}
		if len(tc.row.CSVRecord()) != len(CSVHeader()) {
			t.Errorf("CSVRecord has %d fields, the header %d", len(tc.row.CSVRecord()), len(CSVHeader()))
		}
	}
	want := []string{"t_ms", "key", "cost", "allowed", "remaining", "retry_after_ms", "delay_ms"}
	if got := CSVHeader(); !slices.Equal(got, want) {
		t.Errorf("CSVHeader() = %q, want %q", got, want)
	}
}

func TestSummarySchema(t *testing.T) {
	s := Summary{Offered: 140, Allowed: 140, Delayed: 89, OfferedCost: 140, AllowedCost: 140, MaxDelayMicros: 7 * sec, TotalDelayMicros: 486_500_500}
	b, err := json.Marshal(s)
	want := `{"offered":140,"allowed":140,"refused":0,"delayed":89,"never":0,"offered_cost":140,"allowed_cost":140,"max_delay_ms":7000,"total_delay_ms":486500.5}`
	if err != nil || string(b) != want {
		t.Errorf("json.Marshal(summary) = %s, %v\nwant %s", b, err, want)
	}
}
