// Package jwt is identity's jwt source: it names the client whose signed token (RFC 7519) a
// request carries. It is the one package of sluice that imports a JWT library
// (github.com/golang-jwt/jwt/v5), so that the library, the middleware and the decision layer do
// not; a program that builds its identity sources from a configuration (decision.NewPolicies, in
// the gateway) imports it for its init, which lets identity.NewJWT build a Source:
//
//	import _ "github.com/sluicehq/sluice/identity/jwt"
package jwt

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

	gojwt "github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/identity"
)

// Source names the client whose signed token (RFC 7519) the request carries.
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
type Source struct {
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

// The fields of a Source are identity.JWTConfig's, in the same order, so that one converts to the
// other: identity.NewJWT builds a Source from a configuration without this package's import.
func init() {
	identity.RegisterJWT(func(c identity.JWTConfig) identity.ConfigurableSource { return Source(c) })
}

// Validate reports what is wrong with the configuration; nil if it can be used. Identify does not
// call it: a source that fails it identifies nobody, so call it when loading the configuration.
func (j Source) Validate() error {
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
		m := gojwt.GetSigningMethod(alg)
		if m == nil || strings.EqualFold(alg, "none") {
			return bad("algorithm %q is not supported (want one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA)", alg)
		}
		if _, err := j.keyFor(m); err != nil {
			return bad("algorithm %s: %v", alg, err)
		}
		if h, ok := m.(*gojwt.SigningMethodHMAC); ok && len(j.HMACSecret) < h.Hash.Size() {
			return bad("the HMAC secret is %d bytes; %s needs at least %d (RFC 7518, section 3.2)", len(j.HMACSecret), alg, h.Hash.Size())
		}
	}
	return nil
}

// Identify names the client whose valid token is in the header; see Source for what valid means.
func (j Source) Identify(r identity.Request) (identity.Identity, bool) {
	claims, ok := j.verify(r)
	if !ok {
		return identity.Identity{}, false
	}
	return j.name(claims)
}

// IdentifyClaims is Identify that also returns the named claims of the token, if it verifies
// (signature, algorithm, exp, nbf, iss, aud: all of Identify's checks but the subject's lookup,
// so a valid token whose subject names no client still has its claims): claims[i] is names[i]'s
// value, a string as it is, a number in its shortest decimal form, a boolean as true or false,
// and "" for a claim the token lacks or one of another type (an object, a list, null). claims is
// nil when the token is absent or does not verify: an expired or badly signed token says nothing.
func (j Source) IdentifyClaims(r identity.Request, names []string) (id identity.Identity, ok bool, claims []string) {
	mc, verified := j.verify(r)
	if !verified {
		return identity.Identity{}, false, nil
	}
	claims = make([]string, len(names))
	for i, n := range names {
		claims[i] = claimValue(mc[n])
	}
	id, ok = j.name(mc)
	return id, ok, claims
}

// verify returns the claims of the request's token if it is valid (see Source), whatever its
// subject.
func (j Source) verify(r identity.Request) (gojwt.MapClaims, bool) {
	header := j.Header
	if header == "" {
		header = "Authorization"
	}
	token, _ := identity.BearerToken(r.Header(header))
	if token == "" || j.Lookup == nil {
		return nil, false
	}
	algs := j.algorithms()
	if len(algs) == 0 {
		return nil, false
	}
	opts := make([]gojwt.ParserOption, 0, 6)
	opts = append(opts, gojwt.WithValidMethods(algs), gojwt.WithExpirationRequired(), gojwt.WithLeeway(j.Leeway))
	if j.Now != nil {
		opts = append(opts, gojwt.WithTimeFunc(j.Now))
	}
	if j.Issuer != "" {
		opts = append(opts, gojwt.WithIssuer(j.Issuer))
	}
	if j.Audience != "" {
		opts = append(opts, gojwt.WithAudience(j.Audience))
	}
	claims := gojwt.MapClaims{}
	tok, err := gojwt.NewParser(opts...).ParseWithClaims(token, claims, j.verificationKey)
	if err != nil || !tok.Valid {
		return nil, false
	}
	return claims, true
}

// name returns the client that a verified token's Claim names.
func (j Source) name(claims gojwt.MapClaims) (identity.Identity, bool) {
	claim := j.Claim
	if claim == "" {
		claim = "sub"
	}
	subject, _ := claims[claim].(string)
	if subject == "" {
		return identity.Identity{}, false
	}
	client, ok := j.Lookup(subject)
	if !ok || client == "" {
		return identity.Identity{}, false
	}
	return identity.Identity{Client: client, Key: client, Source: identity.SourceJWT}, true
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

var errCrit = errors.New(`the token's header has a "crit" member`)

// verificationKey is the gojwt.Keyfunc: the configured key for the token's algorithm family.
// WithValidMethods has already refused algorithms that are not configured.
func (j Source) verificationKey(t *gojwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	return j.keyFor(t.Method)
}

// keyFor returns the key that verifies signatures of method m, or an error if none is configured.
// Each family gets only its own kind of key: the HMAC secret is never an RSA or ECDSA key and a
// public key is never an HMAC secret, which is what defeats algorithm confusion.
func (j Source) keyFor(m gojwt.SigningMethod) (any, error) {
	switch m := m.(type) {
	case *gojwt.SigningMethodHMAC:
		if len(j.HMACSecret) == 0 {
			return nil, errors.New("no HMAC secret is configured")
		}
		return j.HMACSecret, nil
	case *gojwt.SigningMethodRSA, *gojwt.SigningMethodRSAPSS:
		if k, ok := j.PublicKey.(*rsa.PublicKey); ok && k != nil {
			return k, nil
		}
		return nil, errors.New("no RSA public key is configured")
	case *gojwt.SigningMethodECDSA:
		k, ok := j.PublicKey.(*ecdsa.PublicKey)
		if !ok || k == nil || k.Curve == nil {
			return nil, errors.New("no ECDSA public key is configured")
		}
		if k.Curve.Params().BitSize != m.CurveBits {
			return nil, fmt.Errorf("the ECDSA key is on %s, not the curve of %s", k.Curve.Params().Name, m.Alg())
		}
		return k, nil
	case *gojwt.SigningMethodEd25519:
		if k, ok := j.PublicKey.(ed25519.PublicKey); ok && len(k) == ed25519.PublicKeySize {
			return k, nil
		}
		return nil, errors.New("no Ed25519 public key is configured")
	}
	return nil, fmt.Errorf("algorithm %s is not supported", m.Alg())
}

// algorithms returns Algorithms, or when it is empty the usual algorithm of each configured key.
func (j Source) algorithms() []string {
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
