package identity

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
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

func TestJWTIdentifyClaims(t *testing.T) {
	k := newKeys(t)
	hs := JWT{HMACSecret: k.hmac, Lookup: subjects, Now: clock, Audience: "orders"}
	names := []string{"org", "tier", "admin", "groups", "missing"}
	claims := with(valid("user-42"), "aud", "orders", "org", "acme", "tier", 3, "admin", true, "groups", []string{"a", "b"})
	for _, c := range []struct {
		name   string
		token  string
		client string   // "" for no identity
		want   []string // nil: not verified
	}{
		{"valid", sign(t, jwt.SigningMethodHS256, k.hmac, claims), "partner-a", []string{"acme", "3", "true", "", ""}},
		// A valid token whose subject is no client's names nobody, but its claims are verified.
		{"unknown subject", sign(t, jwt.SigningMethodHS256, k.hmac, with(claims, "sub", "stranger")), "", []string{"acme", "3", "true", "", ""}},
		{"expired", sign(t, jwt.SigningMethodHS256, k.hmac, with(claims, "exp", now.Add(-time.Second).Unix())), "", nil},
		{"bad signature", sign(t, jwt.SigningMethodHS256, []byte("an-attackers-secret-of-32-bytes!"), claims), "", nil},
		{"wrong audience", sign(t, jwt.SigningMethodHS256, k.hmac, with(claims, "aud", "billing")), "", nil},
		{"tampered", tamper(t, sign(t, jwt.SigningMethodHS256, k.hmac, claims), with(claims, "org", "globex")), "", nil},
		{"no token", "", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r Request
			if c.token == "" {
				r = request(t, "203.0.113.7:1")
			} else {
				r = request(t, "203.0.113.7:1", [2]string{"Authorization", "Bearer " + c.token})
			}
			id, ok, got := hs.IdentifyClaims(r, names)
			if ok != (c.client != "") || id.Client != c.client {
				t.Errorf("identity %+v, %v; want client %q", id, ok, c.client)
			}
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Errorf("claims %q, want %q", got, c.want)
			}
			// Identify agrees with it.
			if iid, iok := hs.Identify(r); iid != id || iok != ok {
				t.Errorf("Identify = %+v, %v; IdentifyClaims %+v, %v", iid, iok, id, ok)
			}
		})
	}
}

func TestChainIdentifyClaims(t *testing.T) {
	k := newKeys(t)
	keys := newByHash(map[string]string{partnerKey: "partner-k"})
	chain := Chain{APIKey{Lookup: keys.lookup}, JWT{HMACSecret: k.hmac, Lookup: subjects, Now: clock}, IP{}}
	tok := "Bearer " + sign(t, jwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "org", "acme"))
	stranger := "Bearer " + sign(t, jwt.SigningMethodHS256, k.hmac, with(valid("stranger"), "org", "globex"))
	for _, c := range []struct {
		name    string
		headers [][2]string
		want    Identity
		claims  []string
	}{
		{"token names the client", [][2]string{{"Authorization", tok}}, Identity{Client: "partner-a", Key: "partner-a", Source: SourceJWT}, []string{"acme"}},
		// The API key names the client; the token is read for its claims only.
		{"api key and token", [][2]string{{"X-API-Key", partnerKey}, {"Authorization", tok}}, Identity{Client: "partner-k", Key: "partner-k", Source: SourceAPIKey}, []string{"acme"}},
		{"api key alone", [][2]string{{"X-API-Key", partnerKey}}, Identity{Client: "partner-k", Key: "partner-k", Source: SourceAPIKey}, nil},
		{"valid token of no client", [][2]string{{"Authorization", stranger}}, Identity{Key: "ip:203.0.113.7", Source: SourceIP}, []string{"globex"}},
		{"nothing", nil, Identity{Key: "ip:203.0.113.7", Source: SourceIP}, nil},
	} {
		r := request(t, "203.0.113.7:1", c.headers...)
		id, claims := chain.IdentifyClaims(r, []string{"org"})
		if id != c.want || !slices.Equal(claims, c.claims) || (claims == nil) != (c.claims == nil) {
			t.Errorf("%s: %+v %q; want %+v %q", c.name, id, claims, c.want, c.claims)
		}
		if got := chain.Identify(r); got != id {
			t.Errorf("%s: Identify = %+v, IdentifyClaims %+v", c.name, got, id)
		}
	}
	// No source at all: the shared anonymous identity, as Identify.
	if id, claims := (Chain{}).IdentifyClaims(request(t, "203.0.113.7:1"), []string{"org"}); id != (Identity{Key: AnonymousKey, Source: SourceNone}) || claims != nil {
		t.Errorf("empty chain: %+v %q", id, claims)
	}
}
