package scenario

import (
	"encoding/json"
	"strings"
	"testing"
)

// 600 a minute against 100 a minute on three instances: separate stores let 300 through, 100 on
// each; a shared store 100, as one instance does. The page's run is the command's.
func TestFleetScenario(t *testing.T) {
	for _, tc := range []struct {
		store       string
		allowed     int64
		perInstance string
	}{
		{"separate", 300, "[[100,100,100]]"},
		{"shared", 100, "[[34,33,33]]"},
	} {
		q := "traffic=600/min+for+1m&limit=100&period=1m&burst=0&instances=3&store=" + tc.store
		sc, errs := Parse(q)
		if errs != nil {
			t.Fatal(errs)
		}
		if sc.Encode() != q {
			t.Errorf("Encode: %s; want %s", sc.Encode(), q)
		}
		if c := sc.Commands(); len(c) != 1 || c[0] != "sluice simulate --compare --limit 100 --period 1m --burst 0 --instances 3 --store "+tc.store+" --traffic '600/min for 1m'" {
			t.Errorf("commands %q", c)
		}
		res, errs := sc.Run()
		if errs != nil {
			t.Fatal(errs)
		}
		fw := res.Runs[0]
		if fw.Summary.Allowed != tc.allowed {
			t.Errorf("%s: fixed-window allowed %d; want %d", tc.store, fw.Summary.Allowed, tc.allowed)
		}
		all := string(res.InstancesJSON(res.Buckets))
		if first := "[" + strings.SplitN(all[1:], "],", 2)[0] + "]]"; first != tc.perInstance {
			t.Errorf("%s: fixed-window per instance %s; want %s (all: %s)", tc.store, first, tc.perInstance, all)
		}
		var doc struct {
			Instances int    `json:"instances"`
			Store     string `json:"store"`
		}
		if err := json.Unmarshal(res.JSON(), &doc); err != nil || doc.Instances != 3 || doc.Store != tc.store {
			t.Errorf("JSON: %+v, %v", doc, err)
		}
		if got := string(res.InstancesJSON(0)); got != "[[],[],[],[],[]]" {
			t.Errorf("before the first bucket: %s", got)
		}
	}
	// One instance: no fleet, whatever the store says; the address drops it.
	sc, errs := Parse("traffic=1+at+once&limit=1&period=1s&burst=0&instances=1&store=separate")
	if errs != nil || sc.Instances != 0 || strings.Contains(sc.Encode(), "store") {
		t.Errorf("one instance: %+v, %v, %s", sc, errs, sc.Encode())
	}
	for _, tc := range []struct{ query, field, want string }{
		{"instances=0", KeyInstances, "0 must be from 1 to 64"},
		{"instances=65", KeyInstances, "65 must be from 1 to 64"},
		{"instances=x", KeyInstances, `"x" is not a whole number`},
		{"instances=2&store=both", KeyStore, `"both": want separate`},
	} {
		_, errs := Parse("traffic=1+at+once&limit=1&period=1s&" + tc.query)
		if len(errs) != 1 || errs[0].Field != tc.field || !strings.Contains(errs[0].Message, tc.want) {
			t.Errorf("%s: errors %v; want %s: %s", tc.query, errs, tc.field, tc.want)
		}
	}
}
