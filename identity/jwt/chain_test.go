package jwt

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gojwt "github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/identity"
)

// The chain's tests that need a jwt source, and the helpers of package identity's tests they use.

const partnerKey = "sk_live_4f1d0c2e9a7b4c6d8e0f1a2b3c4d5e6f"

// request builds a real request as a server would see it: from peer, with the given header lines.
func request(t testing.TB, peer string, headers ...[2]string) identity.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://api.example/orders", nil)
	r.RemoteAddr = peer
	for _, h := range headers {
		r.Header.Add(h[0], h[1])
	}
	return identity.HTTP(r)
}

func prefixes(t testing.TB, ps ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// byHash is a configuration's clients by key hash.
type byHash struct{ clients map[string]string }

func newByHash(keys map[string]string) *byHash {
	b := &byHash{clients: map[string]string{}}
	for key, client := range keys {
		b.clients[identity.HashAPIKey(key)] = client
	}
	return b
}

func (b *byHash) lookup(h string) (string, bool) {
	c, ok := b.clients[h]
	return c, ok
}

func TestChain(t *testing.T) {
	k := newKeys(t)
	keys := newByHash(map[string]string{partnerKey: "partner-a"})
	chain := identity.Chain{
		identity.APIKey{Lookup: keys.lookup},
		Source{HMACSecret: k.hmac, Lookup: subjects, Now: clock},
		identity.IP{TrustedProxies: prefixes(t, "10.0.0.0/8")},
	}
	goodJWT := "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, valid("svc-b"))
	expiredJWT := "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("svc-b"), "exp", now.Add(-time.Minute).Unix()))

	tests := []struct {
		name    string
		peer    string
		headers [][2]string
		want    identity.Identity
	}{
		{"api key wins over jwt", "203.0.113.7:1", [][2]string{{"X-API-Key", partnerKey}, {"Authorization", goodJWT}},
			identity.Identity{Client: "partner-a", Key: "partner-a", Source: identity.SourceAPIKey}},
		{"unknown api key falls through to jwt", "203.0.113.7:1", [][2]string{{"X-API-Key", "sk_wrong"}, {"Authorization", goodJWT}},
			identity.Identity{Client: "partner-b", Key: "partner-b", Source: identity.SourceJWT}},
		{"unknown api key and expired jwt fall through to ip", "203.0.113.7:1", [][2]string{{"X-API-Key", "sk_wrong"}, {"Authorization", expiredJWT}},
			identity.Identity{Key: "ip:203.0.113.7", Source: identity.SourceIP}},
		{"nothing: ip", "[2001:db8:1:2::5]:1", nil,
			identity.Identity{Key: "ip:2001:db8:1:2::/64", Source: identity.SourceIP}},
		{"nothing behind a trusted proxy: forwarded ip", "10.0.0.2:1", [][2]string{{"X-Forwarded-For", "198.51.100.20"}},
			identity.Identity{Key: "ip:198.51.100.20", Source: identity.SourceIP}},
		{"spoofed proxy header does not borrow a key", "198.51.100.20:1", [][2]string{{"X-Forwarded-For", "203.0.113.7"}},
			identity.Identity{Key: "ip:198.51.100.20", Source: identity.SourceIP}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chain.Identify(request(t, tt.peer, tt.headers...))
			if got != tt.want {
				t.Errorf("Identify = %+v, want %+v", got, tt.want)
			}
			if strings.Contains(fmt.Sprintf("%#v", got), partnerKey) || strings.Contains(fmt.Sprintf("%#v", got), "sk_wrong") {
				t.Errorf("the identity contains a plaintext key: %#v", got)
			}
			if got.Anonymous() != (got.Client == "") {
				t.Errorf("Anonymous() = %v for %+v", got.Anonymous(), got)
			}
		})
	}

	if got := (identity.Chain{}).Identify(request(t, "203.0.113.7:1")); got != (identity.Identity{Key: identity.AnonymousKey, Source: identity.SourceNone}) {
		t.Errorf("empty chain: Identify = %+v, want the anonymous identity", got)
	}
	if got := (identity.Chain{identity.APIKey{Lookup: keys.lookup}}).Identify(request(t, "203.0.113.7:1")); got != (identity.Identity{Key: identity.AnonymousKey, Source: identity.SourceNone}) {
		t.Errorf("chain without ip: Identify = %+v, want the anonymous identity", got)
	}
}

func TestJWTIdentifyClaims(t *testing.T) {
	k := newKeys(t)
	hs := Source{HMACSecret: k.hmac, Lookup: subjects, Now: clock, Audience: "orders"}
	names := []string{"org", "tier", "admin", "groups", "missing"}
	claims := with(valid("user-42"), "aud", "orders", "org", "acme", "tier", 3, "admin", true, "groups", []string{"a", "b"})
	for _, c := range []struct {
		name   string
		token  string
		client string   // "" for no identity
		want   []string // nil: not verified
	}{
		{"valid", sign(t, gojwt.SigningMethodHS256, k.hmac, claims), "partner-a", []string{"acme", "3", "true", "", ""}},
		// A valid token whose subject is no client's names nobody, but its claims are verified.
		{"unknown subject", sign(t, gojwt.SigningMethodHS256, k.hmac, with(claims, "sub", "stranger")), "", []string{"acme", "3", "true", "", ""}},
		{"expired", sign(t, gojwt.SigningMethodHS256, k.hmac, with(claims, "exp", now.Add(-time.Second).Unix())), "", nil},
		{"bad signature", sign(t, gojwt.SigningMethodHS256, []byte("an-attackers-secret-of-32-bytes!"), claims), "", nil},
		{"wrong audience", sign(t, gojwt.SigningMethodHS256, k.hmac, with(claims, "aud", "billing")), "", nil},
		{"tampered", tamper(t, sign(t, gojwt.SigningMethodHS256, k.hmac, claims), with(claims, "org", "globex")), "", nil},
		{"no token", "", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r identity.Request
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
	chain := identity.Chain{identity.APIKey{Lookup: keys.lookup}, Source{HMACSecret: k.hmac, Lookup: subjects, Now: clock}, identity.IP{}}
	tok := "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "org", "acme"))
	stranger := "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("stranger"), "org", "globex"))
	for _, c := range []struct {
		name    string
		headers [][2]string
		want    identity.Identity
		claims  []string
	}{
		{"token names the client", [][2]string{{"Authorization", tok}}, identity.Identity{Client: "partner-a", Key: "partner-a", Source: identity.SourceJWT}, []string{"acme"}},
		// The API key names the client; the token is read for its claims only.
		{"api key and token", [][2]string{{"X-API-Key", partnerKey}, {"Authorization", tok}}, identity.Identity{Client: "partner-k", Key: "partner-k", Source: identity.SourceAPIKey}, []string{"acme"}},
		{"api key alone", [][2]string{{"X-API-Key", partnerKey}}, identity.Identity{Client: "partner-k", Key: "partner-k", Source: identity.SourceAPIKey}, nil},
		{"valid token of no client", [][2]string{{"Authorization", stranger}}, identity.Identity{Key: "ip:203.0.113.7", Source: identity.SourceIP}, []string{"globex"}},
		{"nothing", nil, identity.Identity{Key: "ip:203.0.113.7", Source: identity.SourceIP}, nil},
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
	if id, claims := (identity.Chain{}).IdentifyClaims(request(t, "203.0.113.7:1"), []string{"org"}); id != (identity.Identity{Key: identity.AnonymousKey, Source: identity.SourceNone}) || claims != nil {
		t.Errorf("empty chain: %+v %q", id, claims)
	}
}

// Importing this package lets identity.NewJWT make its Source from a configuration, as the
// decision layer does: the same fields, the same verification.
func TestNewJWTMakesSource(t *testing.T) {
	k := newKeys(t)
	src, err := identity.NewJWT(identity.JWTConfig{HMACSecret: k.hmac, Lookup: subjects, Now: clock, Audience: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	want := Source{HMACSecret: k.hmac, Audience: "orders"}
	if s, ok := src.(Source); !ok || string(s.HMACSecret) != string(want.HMACSecret) || s.Audience != want.Audience || s.Lookup == nil || s.Now == nil {
		t.Fatalf("NewJWT = %#v, want a Source of the configuration", src)
	}
	if err := src.Validate(); err != nil {
		t.Fatal(err)
	}
	tok := "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "aud", "orders"))
	if id, ok := src.Identify(request(t, "203.0.113.7:1", [2]string{"Authorization", tok})); !ok || id.Client != "partner-a" {
		t.Fatalf("Identify = %+v, %v", id, ok)
	}
	if _, ok := src.(identity.ClaimsSource); !ok {
		t.Fatal("a Source is not a ClaimsSource: Chain.IdentifyClaims would not read its claims")
	}
	if err := (Source{HMACSecret: k.hmac[:16], Lookup: subjects}).Validate(); err == nil || !strings.Contains(err.Error(), "identity: jwt: the HMAC secret is 16 bytes") {
		t.Fatalf("Validate of a short secret: %v", err)
	}
}
