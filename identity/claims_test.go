package identity

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

func TestQueryValue(t *testing.T) {
	for _, c := range []struct{ raw, name, want string }{
		{"region=eu&x=1", "region", "eu"},
		{"x=1&region=eu", "region", "eu"},
		{"region=eu&region=us", "region", "eu"}, // the first, as url.Values.Get
		{"region=", "region", ""},
		{"region", "region", ""},
		{"regions=eu", "region", ""},
		{"", "region", ""},
		{"region=a%20b+c", "region", "a b c"},
		{"re%67ion=eu", "region", "eu"},          // an escaped name
		{"region=%zz&region=us", "region", "us"}, // a bad escape is skipped, as ParseQuery does
		{"region=eu;x=1&region=us", "region", "us"},
		{"&&region=eu", "region", "eu"},
		{"a+b=1", "a b", "1"},
	} {
		if got := QueryValue(c.raw, c.name); got != c.want {
			t.Errorf("QueryValue(%q, %q) = %q, want %q", c.raw, c.name, got, c.want)
		}
		// The same as net/url, which every net/http handler reads.
		if vs, _ := url.ParseQuery(c.raw); vs.Get(c.name) != c.want {
			t.Errorf("%q: url.ParseQuery gives %q, QueryValue %q", c.raw, vs.Get(c.name), c.want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "http://api.example/orders?region=eu%2Dwest", nil)
	if got := HTTP(r).Query("region"); got != "eu-west" {
		t.Errorf("HTTP(r).Query = %q", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = QueryValue("a=1&region=eu&b=2", "region") }); n != 0 {
		t.Errorf("QueryValue of a plain value allocates %v times", n)
	}
}
