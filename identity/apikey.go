package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// DefaultAPIKeyHeader is the header an APIKey reads when its Header is empty.
const DefaultAPIKeyHeader = "X-API-Key"

// canonicalAPIKeyHeader is DefaultAPIKeyHeader as net/http keys its header map.
const canonicalAPIKeyHeader = "X-Api-Key"

// APIKey names the client whose API key the request carries in a header.
//
// Clients are configured by the SHA-256 of their key, never by the key itself: Identify hashes
// the header's value and asks Lookup for the client with that hash (64 lower-case hex digits).
// The plaintext key is not kept, logged or returned, in an Identity or in an error; only its hash
// is passed on, and only to Lookup. (A hash lookup is not a constant-time comparison; it need not
// be: what its timing could leak is the hash, from which the key cannot be recovered.)
type APIKey struct {
	Header string                                          // the header that carries the key; "" means DefaultAPIKeyHeader
	Lookup func(sha256hex string) (client string, ok bool) // the configured client whose key has this hash
	// LookupSum, if set, is asked instead of Lookup, with the hash as bytes: it saves encoding
	// the hash in hex for a lookup that decodes it again.
	LookupSum func(sum [sha256.Size]byte) (client string, ok bool)
}

// Validate reports what is wrong with the configuration; nil if it can be used.
func (a APIKey) Validate() error {
	if a.Lookup == nil && a.LookupSum == nil {
		return errors.New("identity: api_key: no clients to look keys up in (Lookup is nil)")
	}
	return nil
}

// HeaderName is the header the key is read from.
func (a APIKey) HeaderName() string {
	if a.Header == "" {
		return canonicalAPIKeyHeader
	}
	return a.Header
}

// Key is the API key r carries: its header's value, or with a "Bearer" scheme before it (as in
// `Authorization: Bearer KEY`, the scheme in any case), what follows the scheme. "" if none.
func (a APIKey) Key(r Request) string {
	key, _ := BearerToken(r.Header(a.HeaderName()))
	return key
}

// BearerToken returns the credential of a header value that starts with the "Bearer" scheme (in
// any case: RFC 9110 makes auth-schemes case-insensitive) and whether it did; without the scheme,
// the value itself and false. Spaces around the credential are trimmed either way.
func BearerToken(v string) (token string, ok bool) {
	v = strings.Trim(v, " \t")
	const scheme = "bearer"
	if len(v) > len(scheme) && (v[len(scheme)] == ' ' || v[len(scheme)] == '\t') && strings.EqualFold(v[:len(scheme)], scheme) {
		return strings.TrimLeft(v[len(scheme):], " \t"), true
	}
	return v, false
}

// Identify names the client whose key is in the header (see Key). An absent or empty header, or a
// key that no client has, yields nothing.
func (a APIKey) Identify(r Request) (Identity, bool) {
	key := a.Key(r)
	var client string
	var ok bool
	switch {
	case key == "":
	case a.LookupSum != nil:
		client, ok = a.LookupSum(sha256.Sum256([]byte(key)))
	case a.Lookup != nil:
		client, ok = a.Lookup(HashAPIKey(key))
	}
	if !ok || client == "" {
		return Identity{}, false
	}
	return Identity{Client: client, Key: client, Source: SourceAPIKey}, true
}

// HashAPIKey returns the SHA-256 of key in lower-case hex: what APIKey.Lookup is asked for, and
// what a configuration lists for each client (`printf %s "$KEY" | sha256sum`).
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
