package suggest

import "testing"

func TestField(t *testing.T) {
	fields := []string{"rate_limit", "requests_per_unit", "burst", "algorithm", "key"}
	for s, want := range map[string]string{
		"ratelimit": "rate_limit", "Rate-Limit": "rate_limit", "BURST": "burst", "algoritm": "algorithm",
		"requests_per_units": "requests_per_unit", "kye": "key", "descriptors": "", "": "",
	} {
		if got := Field(s, fields); got != want {
			t.Errorf("Field(%q) = %q, want %q", s, got, want)
		}
	}
}
