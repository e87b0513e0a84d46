package jwt

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	gojwt "github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/identity"
)

// now is the virtual clock of every Source test.
var now = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// subjects maps token subjects to configured clients.
func subjects(sub string) (string, bool) {
	client, ok := map[string]string{"user-42": "partner-a", "svc-b": "partner-b"}[sub]
	return client, ok
}

type keys struct {
	hmac  []byte
	rsa   *rsa.PrivateKey
	ec256 *ecdsa.PrivateKey
	ec384 *ecdsa.PrivateKey
	ed    ed25519.PrivateKey
	other *rsa.PrivateKey // a key nobody configured
}

var (
	keysOnce sync.Once
	testKeys keys
)

// newKeys returns the test keys, generated once per test binary (RSA generation is slow under -race).
func newKeys(t testing.TB) keys {
	t.Helper()
	keysOnce.Do(func() { testKeys = generateKeys(t) })
	if testKeys.rsa == nil {
		t.Fatal("key generation failed")
	}
	return testKeys
}

func generateKeys(t testing.TB) keys {
	t.Helper()
	var k keys
	var err error
	k.hmac = make([]byte, 32)
	rand.Read(k.hmac)
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.other, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.ec256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	return k
}

// sign makes a token; claims are relative to now.
func sign(t testing.TB, m gojwt.SigningMethod, key any, claims gojwt.MapClaims) string {
	t.Helper()
	s, err := gojwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func valid(sub string) gojwt.MapClaims {
	return gojwt.MapClaims{"sub": sub, "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
}

func with(c gojwt.MapClaims, kv ...any) gojwt.MapClaims {
	out := gojwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

func TestJWT(t *testing.T) {
	k := newKeys(t)
	hs := Source{HMACSecret: k.hmac, Lookup: subjects, Now: clock}
	rs := Source{PublicKey: &k.rsa.PublicKey, Lookup: subjects, Now: clock}
	es := Source{PublicKey: &k.ec256.PublicKey, Lookup: subjects, Now: clock}
	ed := Source{PublicKey: k.ed.Public(), Lookup: subjects, Now: clock}
	rsDER, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	rsPKCS1 := x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)

	tests := []struct {
		name   string
		source Source
		token  string
		header string // the Authorization value; default "Bearer " + token
		want   string // the client, or "" for no identity
	}{
		{name: "HS256 valid", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: "partner-a"},
		{name: "RS256 valid", source: rs, token: sign(t, gojwt.SigningMethodRS256, k.rsa, valid("svc-b")), want: "partner-b"},
		{name: "ES256 valid", source: es, token: sign(t, gojwt.SigningMethodES256, k.ec256, valid("user-42")), want: "partner-a"},
		{name: "EdDSA valid", source: ed, token: sign(t, gojwt.SigningMethodEdDSA, k.ed, valid("user-42")), want: "partner-a"},
		{name: "lower-case bearer", source: hs, header: "bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: "partner-a"},
		{name: "upper-case bearer", source: hs, header: "BEARER  " + sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: "partner-a"},
		{name: "no scheme", source: hs, header: sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: "partner-a"},
		{name: "other scheme", source: hs, header: "Basic dXNlcjpwYXNz", want: ""},
		{name: "empty", source: hs, header: "Bearer ", want: ""},
		{name: "garbage", source: hs, header: "Bearer not.a.token", want: ""},

		// Time.
		{name: "expired", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", now.Add(-time.Second).Unix())), want: ""},
		{name: "expiring now", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", now.Unix())), want: ""},
		{name: "expired within leeway", source: with2(hs, 5*time.Second), token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", now.Add(-4*time.Second).Unix())), want: "partner-a"},
		{name: "expired beyond leeway", source: with2(hs, 5*time.Second), token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", now.Add(-6*time.Second).Unix())), want: ""},
		{name: "not yet valid", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "nbf", now.Add(time.Minute).Unix())), want: ""},
		{name: "not yet valid within leeway", source: with2(hs, 5*time.Second), token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "nbf", now.Add(4*time.Second).Unix())), want: "partner-a"},
		{name: "valid since nbf", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "nbf", now.Unix())), want: "partner-a"},
		{name: "no exp", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", nil)), want: ""},
		{name: "exp not a number", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "exp", "tomorrow")), want: ""},

		// Signatures and algorithms.
		{name: "HS256 other secret", source: hs, token: sign(t, gojwt.SigningMethodHS256, []byte("an-attackers-secret-of-32-bytes!"), valid("user-42")), want: ""},
		{name: "RS256 other key", source: rs, token: sign(t, gojwt.SigningMethodRS256, k.other, valid("svc-b")), want: ""},
		{name: "tampered payload", source: hs, token: tamper(t, sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), valid("svc-b")), want: ""},
		{name: "alg none", source: hs, token: sign(t, gojwt.SigningMethodNone, gojwt.UnsafeAllowNoneSignatureType, valid("user-42")), want: ""},
		{name: "alg none listed", source: Source{Algorithms: []string{"none", "HS256"}, HMACSecret: k.hmac, Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodNone, gojwt.UnsafeAllowNoneSignatureType, valid("user-42")), want: ""},
		{name: "confusion: HS256 with the RSA public key (PKIX) as secret", source: rs, token: sign(t, gojwt.SigningMethodHS256, rsDER, valid("svc-b")), want: ""},
		{name: "confusion: HS256 with the RSA public key (PKCS1) as secret", source: rs, token: sign(t, gojwt.SigningMethodHS256, rsPKCS1, valid("svc-b")), want: ""},
		{name: "confusion even when HS256 is listed", source: Source{Algorithms: []string{"HS256", "RS256"}, PublicKey: &k.rsa.PublicKey, Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, rsDER, valid("svc-b")), want: ""},
		{name: "wrong alg: RS384 when RS256 configured", source: rs, token: sign(t, gojwt.SigningMethodRS384, k.rsa, valid("svc-b")), want: ""},
		{name: "wrong alg: PS256 when RS256 configured", source: rs, token: sign(t, gojwt.SigningMethodPS256, k.rsa, valid("svc-b")), want: ""},
		{name: "listed alg: RS384", source: Source{Algorithms: []string{"RS256", "RS384"}, PublicKey: &k.rsa.PublicKey, Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodRS384, k.rsa, valid("svc-b")), want: "partner-b"},
		{name: "wrong alg: ES256 token on an RSA source", source: rs, token: sign(t, gojwt.SigningMethodES256, k.ec256, valid("svc-b")), want: ""},
		{name: "ES384 token on a P-256 source", source: Source{Algorithms: []string{"ES256", "ES384"}, PublicKey: &k.ec256.PublicKey, Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodES384, k.ec384, valid("user-42")), want: ""},
		{name: "crit header", source: hs, token: signWithHeader(t, k.hmac, valid("user-42"), "crit", []string{"exp"}), want: ""},

		// Claims.
		{name: "unknown subject", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, valid("stranger")), want: ""},
		{name: "no subject", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "sub", nil)), want: ""},
		{name: "subject not a string", source: hs, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "sub", 42)), want: ""},
		{name: "custom claim", source: Source{HMACSecret: k.hmac, Claim: "client_id", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("nobody"), "client_id", "svc-b")), want: "partner-b"},
		{name: "issuer matches", source: Source{HMACSecret: k.hmac, Issuer: "https://idp.example", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "iss", "https://idp.example")), want: "partner-a"},
		{name: "issuer differs", source: Source{HMACSecret: k.hmac, Issuer: "https://idp.example", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "iss", "https://evil.example")), want: ""},
		{name: "issuer missing", source: Source{HMACSecret: k.hmac, Issuer: "https://idp.example", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: ""},
		{name: "audience in list", source: Source{HMACSecret: k.hmac, Audience: "orders-api", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "aud", []string{"billing", "orders-api"})), want: "partner-a"},
		{name: "audience differs", source: Source{HMACSecret: k.hmac, Audience: "orders-api", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, with(valid("user-42"), "aud", "billing")), want: ""},
		{name: "audience missing", source: Source{HMACSecret: k.hmac, Audience: "orders-api", Lookup: subjects, Now: clock}, token: sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42")), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			header := tt.header
			if header == "" {
				header = "Bearer " + tt.token
			}
			r := request(t, "203.0.113.7:1", [2]string{"Authorization", header})
			id, ok := tt.source.Identify(r)
			switch {
			case tt.want == "" && ok:
				t.Fatalf("Identify = %+v, want no identity", id)
			case tt.want != "" && !ok:
				t.Fatalf("Identify: no identity, want %q", tt.want)
			case tt.want != "" && id != (identity.Identity{Client: tt.want, Key: tt.want, Source: identity.SourceJWT}):
				t.Fatalf("Identify = %+v, want client %q", id, tt.want)
			}
			// Whatever the token, a chain with an IP source after it still identifies the request.
			got := identity.Chain{tt.source, identity.IP{}}.Identify(r)
			if tt.want == "" && got != (identity.Identity{Key: "ip:203.0.113.7", Source: identity.SourceIP}) {
				t.Errorf("Chain.Identify = %+v, want the fall-through to ip", got)
			}
		})
	}
}

func with2(j Source, leeway time.Duration) Source { j.Leeway = leeway; return j }

// tamper replaces a signed token's payload and keeps its signature.
func tamper(t testing.TB, token string, claims gojwt.MapClaims) string {
	t.Helper()
	parts := strings.Split(token, ".")
	other := strings.Split(sign(t, gojwt.SigningMethodHS256, []byte("x"), claims), ".")
	return parts[0] + "." + other[1] + "." + parts[2]
}

func signWithHeader(t testing.TB, secret []byte, claims gojwt.MapClaims, key string, value any) string {
	t.Helper()
	tok := gojwt.NewWithClaims(gojwt.SigningMethodHS256, claims)
	tok.Header[key] = value
	s, err := tok.SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWTCustomHeader(t *testing.T) {
	k := newKeys(t)
	j := Source{Header: "X-Token", HMACSecret: k.hmac, Lookup: subjects, Now: clock}
	tok := sign(t, gojwt.SigningMethodHS256, k.hmac, valid("user-42"))
	if id, ok := j.Identify(request(t, "203.0.113.7:1", [2]string{"X-Token", tok})); !ok || id.Client != "partner-a" {
		t.Errorf("X-Token: Identify = %+v, %v; want partner-a", id, ok)
	}
	if id, ok := j.Identify(request(t, "203.0.113.7:1", [2]string{"Authorization", "Bearer " + tok})); ok {
		t.Errorf("Authorization when X-Token is configured: Identify = %+v, want nothing", id)
	}
}

func TestJWTDefaultClock(t *testing.T) {
	k := newKeys(t)
	j := Source{HMACSecret: k.hmac, Lookup: subjects}
	live := gojwt.MapClaims{"sub": "user-42", "exp": time.Now().Add(time.Hour).Unix()}
	if _, ok := j.Identify(request(t, "203.0.113.7:1", [2]string{"Authorization", "Bearer " + sign(t, gojwt.SigningMethodHS256, k.hmac, live)})); !ok {
		t.Error("a token valid now was not accepted on the real clock")
	}
}

func TestJWTValidate(t *testing.T) {
	k := newKeys(t)
	good := []Source{
		{HMACSecret: k.hmac, Lookup: subjects},
		{PublicKey: &k.rsa.PublicKey, Lookup: subjects},
		{PublicKey: &k.ec256.PublicKey, Lookup: subjects},
		{PublicKey: &k.ec384.PublicKey, Lookup: subjects, Algorithms: []string{"ES384"}},
		{PublicKey: k.ed.Public(), Lookup: subjects},
		{HMACSecret: k.hmac, PublicKey: &k.rsa.PublicKey, Algorithms: []string{"HS256", "RS256", "PS256"}, Lookup: subjects},
	}
	for i, j := range good {
		if err := j.Validate(); err != nil {
			t.Errorf("good[%d]: %v", i, err)
		}
	}
	bad := map[string]Source{
		"no lookup":            {HMACSecret: k.hmac},
		"no key":               {Lookup: subjects},
		"short secret":         {HMACSecret: []byte("short"), Lookup: subjects},
		"short for HS512":      {HMACSecret: k.hmac, Algorithms: []string{"HS512"}, Lookup: subjects},
		"none":                 {HMACSecret: k.hmac, Algorithms: []string{"none"}, Lookup: subjects},
		"unknown alg":          {HMACSecret: k.hmac, Algorithms: []string{"HS1024"}, Lookup: subjects},
		"RS256 without RSA":    {HMACSecret: k.hmac, Algorithms: []string{"RS256"}, Lookup: subjects},
		"HS256 without secret": {PublicKey: &k.rsa.PublicKey, Algorithms: []string{"HS256"}, Lookup: subjects},
		"ES256 on P-384":       {PublicKey: &k.ec384.PublicKey, Algorithms: []string{"ES256"}, Lookup: subjects},
		"private key":          {PublicKey: k.rsa, Lookup: subjects},
		"negative leeway":      {HMACSecret: k.hmac, Leeway: -time.Second, Lookup: subjects},
	}
	for name, j := range bad {
		if err := j.Validate(); err == nil {
			t.Errorf("%s: Validate = nil, want an error", name)
		} else if j.HMACSecret != nil && strings.Contains(err.Error(), string(j.HMACSecret)) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

func BenchmarkJWTIdentify(b *testing.B) {
	k := newKeys(b)
	for _, bc := range []struct {
		name   string
		source Source
		token  string
	}{
		{"HS256", Source{HMACSecret: k.hmac, Lookup: subjects, Now: clock}, sign(b, gojwt.SigningMethodHS256, k.hmac, valid("user-42"))},
		{"RS256", Source{PublicKey: &k.rsa.PublicKey, Lookup: subjects, Now: clock}, sign(b, gojwt.SigningMethodRS256, k.rsa, valid("user-42"))},
		{"ES256", Source{PublicKey: &k.ec256.PublicKey, Lookup: subjects, Now: clock}, sign(b, gojwt.SigningMethodES256, k.ec256, valid("user-42"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := request(b, "203.0.113.7:1", [2]string{"Authorization", "Bearer " + bc.token})
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := bc.source.Identify(r); !ok {
					b.Fatal("not identified")
				}
			}
		})
	}
}
