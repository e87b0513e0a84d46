package identity

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const partnerKey = "sk_live_4f1d0c2e9a7b4c6d8e0f1a2b3c4d5e6f"

// byHash is a configuration's clients by key hash; it records what it was asked.
type byHash struct {
	clients map[string]string
	asked   []string
}

func newByHash(keys map[string]string) *byHash {
	b := &byHash{clients: map[string]string{}}
	for key, client := range keys {
		b.clients[HashAPIKey(key)] = client
	}
	return b
}

func (b *byHash) lookup(h string) (string, bool) {
	b.asked = append(b.asked, h)
	c, ok := b.clients[h]
	return c, ok
}

func TestHashAPIKey(t *testing.T) {
	// printf %s abc | sha256sum
	if got, want := HashAPIKey("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("HashAPIKey(abc) = %s, want %s", got, want)
	}
}

func TestAPIKey(t *testing.T) {
	clients := newByHash(map[string]string{partnerKey: "partner-a"})
	src := APIKey{Header: "X-API-Key", Lookup: clients.lookup}

	id, ok := src.Identify(request(t, "203.0.113.7:1", [2]string{"X-API-Key", partnerKey}))
	if want := (Identity{Client: "partner-a", Key: "partner-a", Source: SourceAPIKey}); !ok || id != want {
		t.Fatalf("known key: Identify = %+v, %v; want %+v", id, ok, want)
	}
	if strings.Contains(fmt.Sprintf("%#v", id), partnerKey) {
		t.Errorf("the identity contains the plaintext key: %#v", id)
	}
	hex := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, h := range clients.asked {
		if !hex.MatchString(h) || strings.Contains(h, partnerKey) {
			t.Errorf("Lookup was asked %q, want only a lower-case hex SHA-256", h)
		}
	}

	for name, headers := range map[string][][2]string{
		"unknown key":           {{"X-API-Key", "sk_live_guessed"}},
		"empty header":          {{"X-API-Key", ""}},
		"no header":             nil,
		"other header":          {{"Authorization", "Bearer " + partnerKey}},
		"key with case changed": {{"X-API-Key", strings.ToUpper(partnerKey)}},
	} {
		if id, ok := src.Identify(request(t, "203.0.113.7:1", headers...)); ok {
			t.Errorf("%s: Identify = %+v, want nothing", name, id)
		}
	}
}

func TestAPIKeyDefaultHeaderAndValidate(t *testing.T) {
	clients := newByHash(map[string]string{partnerKey: "partner-a"})
	if id, ok := (APIKey{Lookup: clients.lookup}).Identify(request(t, "203.0.113.7:1", [2]string{"x-api-key", partnerKey})); !ok || id.Client != "partner-a" {
		t.Errorf("default header: Identify = %+v, %v", id, ok)
	}
	if err := (APIKey{}).Validate(); err == nil {
		t.Error("APIKey without Lookup: Validate = nil")
	}
	if _, ok := (APIKey{}).Identify(request(t, "203.0.113.7:1", [2]string{"X-API-Key", partnerKey})); ok {
		t.Error("APIKey without Lookup named a client")
	}
}

func TestChain(t *testing.T) {
	k := newKeys(t)
	keys := newByHash(map[string]string{partnerKey: "partner-a"})
	chain := Chain{
		APIKey{Lookup: keys.lookup},
		JWT{HMACSecret: k.hmac, Lookup: subjects, Now: clock},
		IP{TrustedProxies: prefixes(t, "10.0.0.0/8")},
	}
	goodJWT := "Bearer " + sign(t, jwt.SigningMethodHS256, k.hmac, valid("svc-b"))
	expiredJWT := "Bearer " + sign(t, jwt.SigningMethodHS256, k.hmac, with(valid("svc-b"), "exp", now.Add(-time.Minute).Unix()))

	tests := []struct {
		name    string
		peer    string
		headers [][2]string
		want    Identity
	}{
		{"api key wins over jwt", "203.0.113.7:1", [][2]string{{"X-API-Key", partnerKey}, {"Authorization", goodJWT}},
			Identity{Client: "partner-a", Key: "partner-a", Source: SourceAPIKey}},
		{"unknown api key falls through to jwt", "203.0.113.7:1", [][2]string{{"X-API-Key", "sk_wrong"}, {"Authorization", goodJWT}},
			Identity{Client: "partner-b", Key: "partner-b", Source: SourceJWT}},
		{"unknown api key and expired jwt fall through to ip", "203.0.113.7:1", [][2]string{{"X-API-Key", "sk_wrong"}, {"Authorization", expiredJWT}},
			Identity{Key: "ip:203.0.113.7", Source: SourceIP}},
		{"nothing: ip", "[2001:db8:1:2::5]:1", nil,
			Identity{Key: "ip:2001:db8:1:2::/64", Source: SourceIP}},
		{"nothing behind a trusted proxy: forwarded ip", "10.0.0.2:1", [][2]string{{"X-Forwarded-For", "198.51.100.20"}},
			Identity{Key: "ip:198.51.100.20", Source: SourceIP}},
		{"spoofed proxy header does not borrow a key", "198.51.100.20:1", [][2]string{{"X-Forwarded-For", "203.0.113.7"}},
			Identity{Key: "ip:198.51.100.20", Source: SourceIP}},
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

	if got := (Chain{}).Identify(request(t, "203.0.113.7:1")); got != (Identity{Key: AnonymousKey, Source: SourceNone}) {
		t.Errorf("empty chain: Identify = %+v, want the anonymous identity", got)
	}
	if got := (Chain{APIKey{Lookup: keys.lookup}}).Identify(request(t, "203.0.113.7:1")); got != (Identity{Key: AnonymousKey, Source: SourceNone}) {
		t.Errorf("chain without ip: Identify = %+v, want the anonymous identity", got)
	}
}

func BenchmarkAPIKeyIdentify(b *testing.B) {
	clients := newByHash(map[string]string{partnerKey: "partner-a"})
	src := APIKey{Lookup: func(h string) (string, bool) { c, ok := clients.clients[h]; return c, ok }}
	r := request(b, "203.0.113.7:1", [2]string{"X-API-Key", partnerKey})
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := src.Identify(r); !ok {
			b.Fatal("not identified")
		}
	}
}

func TestCheckClientName(t *testing.T) {
	for _, ok := range []string{"partner-a", "customer-42", "IP:not-reserved-case-differs", "anonymous-corp"} {
		if err := CheckClientName(ok); err != nil {
			t.Errorf("CheckClientName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "anonymous", "ip:203.0.113.7", "ip:"} {
		if err := CheckClientName(bad); err == nil {
			t.Errorf("CheckClientName(%q) = nil", bad)
		}
	}
}
