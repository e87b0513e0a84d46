package scenario

import (
	"strings"
	"testing"
)

// Any address parses without a panic, and a scenario's address is canonical: the scenario it
// reads back as has the same address.
func FuzzParseEncode(f *testing.F) {
	f.Add(burstQuery)
	for _, p := range Presets {
		f.Add(p.Query)
	}
	f.Add("traffic=1+at+once&limit=1&period=1ms&burst=0&jitter=1us&draw=18446744073709551615&sliding-log.limit=3&token-bucket.burst=2")
	f.Add("traffic=5/s for 1s;;&limit=9007199254740992&period=1h0m0.5s&leaky-bucket.period=90s")
	f.Add("?traffic=%zz&limit=&fixed-window.burst=1")
	f.Add("traffic=a:+1+at+once%3Bb:+2/s+for+1s&limit=1&period=1s&instances=2&store=shared&balance=random&store-latency=1ms&outage=0s-1s&on-error=open")
	f.Fuzz(func(t *testing.T, query string) {
		sc, errs := Parse(query)
		for _, e := range errs {
			if e.Message == "" {
				t.Errorf("Parse(%q): an error with no message for %q", query, e.Field)
			}
		}
		if errs != nil {
			return
		}
		q := sc.Encode()
		again, errs := Parse(q)
		if errs != nil {
			t.Fatalf("Parse(%q) = %q, which does not parse: %v", query, q, errs)
		}
		if again.Encode() != q {
			t.Fatalf("Parse(%q) = %q, which reads back as %q", query, q, again.Encode())
		}
		if len(sc.Commands()) == 0 || !strings.HasPrefix(sc.Commands()[0], "sluice simulate ") {
			t.Fatalf("Commands: %q", sc.Commands())
		}
	})
}

// The generator writes patterns that parse, or says which field is wrong.
func FuzzGenerator(f *testing.F) {
	f.Add("rate=5&duration=21s&burst_size=40&burst_at=10s&burst_over=1s")
	f.Add("rate=0.125&duration=1m&burst_size=1&burst_at=59s")
	f.Fuzz(func(t *testing.T, query string) {
		g, errs := ParseGenerator(query)
		if errs != nil {
			return
		}
		pattern, errs := g.Pattern()
		if errs != nil {
			return
		}
		if _, errs := (&Scenario{Traffic: pattern}).Requests(); errs != nil && !strings.Contains(errs.Error(), "the page takes at most") {
			t.Fatalf("the generator's pattern %q does not run: %v", pattern, errs)
		}
	})
}
