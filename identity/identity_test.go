package identity

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
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

// A key sent the standard way, `Authorization: Bearer KEY`, is the key after the scheme (in any
// case), not the whole value (which named nobody: the client was anonymous); Lookup never sees it.
func TestAPIKeyAfterBearerScheme(t *testing.T) {
	clients := newByHash(map[string]string{partnerKey: "partner-a"})
	src := APIKey{Header: "Authorization", Lookup: clients.lookup}
	// (The messages name the case by its number: never the key.)
	for i, v := range []string{"Bearer " + partnerKey, "bearer " + partnerKey, "BEARER  " + partnerKey, partnerKey} {
		if id, ok := src.Identify(request(t, "203.0.113.7:1", [2]string{"Authorization", v})); !ok || id.Client != "partner-a" {
			t.Errorf("Authorization value %d: Identify = %+v, %v; want partner-a", i, id, ok)
		}
	}
	for i, v := range []string{"Bearer", "Bearer ", "Basic " + partnerKey, "Bearer" + partnerKey} {
		if id, ok := src.Identify(request(t, "203.0.113.7:1", [2]string{"Authorization", v})); ok {
			t.Errorf("wrong Authorization value %d: Identify = %+v, want nothing", i, id)
		}
	}
	for _, h := range clients.asked {
		if strings.Contains(h, partnerKey) {
			t.Errorf("Lookup was asked %q", h)
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

// This package's tests do not import package jwt, so nothing makes a jwt source: NewJWT says
// what to import, and decides nothing.
func TestNewJWTWithoutPackageJWT(t *testing.T) {
	src, err := NewJWT(JWTConfig{HMACSecret: make([]byte, 32), Lookup: func(string) (string, bool) { return "", false }})
	if src != nil || err != ErrNoJWT || !strings.Contains(err.Error(), "github.com/sluicehq/sluice/identity/jwt") {
		t.Fatalf("NewJWT without package jwt: %v, %v; want ErrNoJWT naming the package", src, err)
	}
}
