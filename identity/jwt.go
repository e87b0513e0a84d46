package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWT names the client whose signed token (RFC 7519) the request carries.
//
// A token names a client only if all of these hold; otherwise it yields nothing and the next
// source is asked:
//   - its "alg" is one of Algorithms, and its signature verifies with the configured key of that
//     algorithm's family: HMACSecret for HS256/384/512 only, PublicKey for RS*/PS* (an RSA key),
//     ES256/384/512 (an ECDSA key on the matching curve) or EdDSA (an Ed25519 key). "none" is never
//     accepted, and no key is ever used for another family, so a token signed with HS256 using the
//     RSA public key as its secret (algorithm confusion) does not verify;
//   - it has an "exp" claim, and now < exp + Leeway; if it has an "nbf" claim, now ≥ nbf - Leeway;
//   - its "iss" is Issuer and its "aud" contains Audience, when those are set;
//   - its header has no "crit" member (no extension this verifier would have to understand);
//   - Claim is a non-empty string that Lookup knows.
//
// Tokens without "exp" are refused: a stolen token that never expires would name its client
// forever.
type JWT struct {
	Header     string           // the header that carries the token; "" means Authorization. A "Bearer " prefix is stripped, in any case.
	Algorithms []string         // the accepted "alg" values; empty means the usual one for each configured key (HS256; RS256; ES256/384/512 by curve; EdDSA)
	HMACSecret []byte           // the secret for HS256/384/512; at least as long as the hash (32, 48, 64 bytes)
	PublicKey  crypto.PublicKey // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey, for RS*/PS*, ES* or EdDSA
	Claim      string           // the claim that names the client; "" means "sub"
	Issuer     string           // if set, the required "iss"
	Audience   string           // if set, a value the "aud" claim must contain
	Leeway     time.Duration    // clock skew allowed on "exp" and "nbf"
	Lookup     func(subject string) (client string, ok bool)
	Now        func() time.Time // the clock; nil means time.Now
}

// Validate reports what is wrong with the configuration; nil if it can be used. Identify does not
// call it: a source that fails it identifies nobody, so call it when loading the configuration.
func (j JWT) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("identity: jwt: "+format, args...)
	}
	if j.Lookup == nil {
		return bad("no clients to look subjects up in (Lookup is nil)")
	}
	if len(j.HMACSecret) == 0 && j.PublicKey == nil {
		return bad("no key: set an HMAC secret (HS256) or a public key (RS256, ES256, EdDSA)")
	}
	switch j.PublicKey.(type) {
	case nil, *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
	default:
		return bad("public key of type %T is not supported (want an RSA, ECDSA or Ed25519 public key)", j.PublicKey)
	}
	if j.Leeway < 0 {
		return bad("leeway %v must be ≥ 0", j.Leeway)
	}
	algs := j.algorithms()
	if len(algs) == 0 {
		return bad("no algorithm can be used with the configured keys")
	}
	for _, alg := range algs {
		m := jwt.GetSigningMethod(alg)
		if m == nil || strings.EqualFold(alg, "none") {
			return bad("algorithm %q is not supported (want one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA)", alg)
		}
		if _, err := j.keyFor(m); err != nil {
			return bad("algorithm %s: %v", alg, err)
		}
		if h, ok := m.(*jwt.SigningMethodHMAC); ok && len(j.HMACSecret) < h.Hash.Size() {
			return bad("the HMAC secret is %d bytes; %s needs at least %d (RFC 7518, section 3.2)", len(j.HMACSecret), alg, h.Hash.Size())
		}
	}
	return nil
}

// Identify names the client whose valid token is in the header; see JWT for what valid means.
func (j JWT) Identify(r Request) (Identity, bool) {
	claims, ok := j.verify(r)
	if !ok {
		return Identity{}, false
	}
	return j.name(claims)
}

// IdentifyClaims is Identify that also returns the named claims of the token, if it verifies
// (signature, algorithm, exp, nbf, iss, aud: all of Identify's checks but the subject's lookup,
// so a valid token whose subject names no client still has its claims): claims[i] is names[i]'s
// value, a string as it is, a number in its shortest decimal form, a boolean as true or false,
// and "" for a claim the token lacks or one of another type (an object, a list, null). claims is
// nil when the token is absent or does not verify: an expired or badly signed token says nothing.
func (j JWT) IdentifyClaims(r Request, names []string) (id Identity, ok bool, claims []string) {
	mc, verified := j.verify(r)
	if !verified {
		return Identity{}, false, nil
	}
	claims = make([]string, len(names))
	for i, n := range names {
		claims[i] = claimValue(mc[n])
	}
	id, ok = j.name(mc)
	return id, ok, claims
}

// verify returns the claims of the request's token if it is valid (see JWT), whatever its
// subject.
func (j JWT) verify(r Request) (jwt.MapClaims, bool) {
	header := j.Header
	if header == "" {
		header = "Authorization"
	}
	token := bearerToken(r.Header(header))
	if token == "" || j.Lookup == nil {
		return nil, false
	}
	algs := j.algorithms()
	if len(algs) == 0 {
		return nil, false
	}
	opts := make([]jwt.ParserOption, 0, 6)
	opts = append(opts, jwt.WithValidMethods(algs), jwt.WithExpirationRequired(), jwt.WithLeeway(j.Leeway))
	if j.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(j.Now))
	}
	if j.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.Issuer))
	}
	if j.Audience != "" {
		opts = append(opts, jwt.WithAudience(j.Audience))
	}
	claims := jwt.MapClaims{}
	tok, err := jwt.NewParser(opts...).ParseWithClaims(token, claims, j.verificationKey)
	if err != nil || !tok.Valid {
		return nil, false
	}
	return claims, true
}

// name returns the client that a verified token's Claim names.
func (j JWT) name(claims jwt.MapClaims) (Identity, bool) {
	claim := j.Claim
	if claim == "" {
		claim = "sub"
	}
	subject, _ := claims[claim].(string)
	if subject == "" {
		return Identity{}, false
	}
	client, ok := j.Lookup(subject)
	if !ok || client == "" {
		return Identity{}, false
	}
	return Identity{Client: client, Key: client, Source: SourceJWT}, true
}

// claimValue is a claim's value as a key takes it: see IdentifyClaims.
func claimValue(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	}
	return ""
}

// bearerToken strips an optional "Bearer " scheme (any case) and surrounding spaces.
func bearerToken(v string) string {
	v = strings.TrimSpace(v)
	if len(v) > len("bearer ") && strings.EqualFold(v[:len("bearer ")], "bearer ") {
		v = strings.TrimLeft(v[len("bearer "):], " ")
	}
	return v
}

var errCrit = errors.New(`the token's header has a "crit" member`)

// verificationKey is the jwt.Keyfunc: the configured key for the token's algorithm family.
// WithValidMethods has already refused algorithms that are not configured.
func (j JWT) verificationKey(t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	return j.keyFor(t.Method)
}

// keyFor returns the key that verifies signatures of method m, or an error if none is configured.
// Each family gets only its own kind of key: the HMAC secret is never an RSA or ECDSA key and a
// public key is never an HMAC secret, which is what defeats algorithm confusion.
func (j JWT) keyFor(m jwt.SigningMethod) (any, error) {
	switch m := m.(type) {
	case *jwt.SigningMethodHMAC:
		if len(j.HMACSecret) == 0 {
			return nil, errors.New("no HMAC secret is configured")
		}
		return j.HMACSecret, nil
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		if k, ok := j.PublicKey.(*rsa.PublicKey); ok && k != nil {
			return k, nil
		}
		return nil, errors.New("no RSA public key is configured")
	case *jwt.SigningMethodECDSA:
		k, ok := j.PublicKey.(*ecdsa.PublicKey)
		if !ok || k == nil || k.Curve == nil {
			return nil, errors.New("no ECDSA public key is configured")
		}
		if k.Curve.Params().BitSize != m.CurveBits {
			return nil, fmt.Errorf("the ECDSA key is on %s, not the curve of %s", k.Curve.Params().Name, m.Alg())
		}
		return k, nil
	case *jwt.SigningMethodEd25519:
		if k, ok := j.PublicKey.(ed25519.PublicKey); ok && len(k) == ed25519.PublicKeySize {
			return k, nil
		}
		return nil, errors.New("no Ed25519 public key is configured")
	}
	return nil, fmt.Errorf("algorithm %s is not supported", m.Alg())
}

// algorithms returns Algorithms, or when it is empty the usual algorithm of each configured key.
func (j JWT) algorithms() []string {
	if len(j.Algorithms) > 0 {
		return j.Algorithms
	}
	algs := make([]string, 0, 2)
	if len(j.HMACSecret) > 0 {
		algs = append(algs, "HS256")
	}
	switch k := j.PublicKey.(type) {
	case *rsa.PublicKey:
		algs = append(algs, "RS256")
	case *ecdsa.PublicKey:
		if k != nil && k.Curve != nil {
			switch k.Curve {
			case elliptic.P256():
				algs = append(algs, "ES256")
			case elliptic.P384():
				algs = append(algs, "ES384")
			case elliptic.P521():
				algs = append(algs, "ES512")
			}
		}
	case ed25519.PublicKey:
		algs = append(algs, "EdDSA")
	}
	return algs
}
