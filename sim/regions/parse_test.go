package regions

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The regions page's first scenario (web/assets/regions.js), as its query string.
var pageQuery = url.Values{
	"regions": {"eu,us,ap"}, "traffic": {"eu: 70/s for 3m; 10/s for 4m; us: 20/s for 7m; ap: 10/s for 3m; 70/s for 4m"},
	"algorithm": {"fixed-window"}, "limit": {"4800"}, "period": {"1m"}, "ledger-latency": {"50ms-150ms"},
	"floor": {"0.05"}, "safe-share": {"0.1"}, "partition": {"us@4m-4m45s"}, "flush-ledger": {"5m30s"},
}.Encode()

// ParseQuery reads the command line's flags from a query string, with its defaults, and the run
// of the page's first scenario holds its bound.
func TestParseQuery(t *testing.T) {
	o, errs := ParseQuery(pageQuery)
	if errs != nil {
		t.Fatal(errs)
	}
	if o.Draw != 1 || o.LatencyMin != 50*time.Millisecond || o.LatencyMax != 150*time.Millisecond || len(o.Requests) == 0 ||
		len(o.Partitions) != 1 || o.Partitions[0] != (Partition{"us", 4 * time.Minute, 4*time.Minute + 45*time.Second}) ||
		len(o.Flushes) != 1 || o.Flushes[0] != 5*time.Minute+30*time.Second {
		t.Fatalf("options %+v", o)
	}
	res, err := Run(o)
	if err != nil || !res.Held || len(res.Windows) != 7 {
		t.Fatalf("run: %v, %+v", err, res)
	}
	two, errs := ParseQuery(pageQuery + "&partition=eu@1m-2m,ap@2m-3m&flush-ledger=1m")
	if errs != nil || len(two.Partitions) != 3 || len(two.Flushes) != 2 {
		t.Errorf("several partitions and flushes: %v, %+v %v", errs, two.Partitions, two.Flushes)
	}
}

// Every error names its field: the page shows it there.
func TestParseQueryErrors(t *testing.T) {
	for _, tc := range []struct{ change, field, message string }{
		{"traffic=eu: 10/s for", "traffic", ""},
		{"traffic=", "traffic", "each region's pattern is needed"},
		{"limit=ten", "limit", "whole number"},
		{"limit=0", "limit", "must be > 0"},
		{"period=soon", "period", "duration"},
		{"algorithm=sliding-log", "algorithm", "fixed-window, sliding-window or token-bucket"},
		{"burst=3", "burst", "takes no burst"},
		{"refresh=0s", "refresh", "must be > 0"},
		{"lease=5s", "lease", "at least twice"},
		{"ledger-latency=fast", "ledger-latency", "Go durations"},
		{"ledger-latency=2s", "ledger-latency", "a quarter"},
		{"floor=0.5", "floor", "1/regions"},
		{"safe-share=x", "safe-share", "fraction"},
		{"ledger-algorithm=random", "ledger-algorithm", "fair or proportional"},
		{"partition=mars@1m-2m", "partition", `"mars"`},
		{"partition=us", "partition", "REGION@FROM-TO"},
		{"flush-ledger=later", "flush-ledger", "virtual time"},
		{"draw=-1", "draw", "whole number"},
		{"regions=eu,us", "traffic", `the traffic names "ap"`},
		{"regions=", "regions", "name the regions"},
		{"instances=3", "instances", "not an option"},
	} {
		q, _ := url.ParseQuery(pageQuery)
		k, v, _ := strings.Cut(tc.change, "=")
		q.Set(k, v)
		o, errs := ParseQuery(q.Encode())
		if errs == nil {
			_, err := Run(o)
			errs = []error{err}
		}
		var oe *OptionError
		if len(errs) != 1 || !errors.As(errs[0], &oe) || oe.Field != tc.field || !strings.Contains(oe.Message, tc.message) {
			t.Errorf("%s: %v; want one error of %s saying %q", tc.change, errs, tc.field, tc.message)
		}
	}
}
