// Package identity tells the gateway who sent a request: a configured client, named by its API
// key or its token, or else an anonymous client known only by its network address.
//
// A Chain asks its sources in order and the first that names a client wins:
//
//	chain := identity.Chain{
//		identity.APIKey{Header: "X-API-Key", Lookup: byKeyHash},
//		jwt.Source{HMACSecret: secret, Lookup: bySubject}, // package identity/jwt
//		identity.IP{TrustedProxies: proxies},
//	}
//	id := chain.Identify(r) // id.Key is the rate-limit key; id.Client the client's name, or ""
//
// An invalid or unknown credential never names a client: a wrong API key, a token that is
// expired, not yet valid, badly signed, signed with an algorithm that was not configured, or whose
// subject is unknown, yields nothing, and the next source is asked. A credential is never an
// error the client could learn from, and never a way to borrow another client's quota.
//
// Every source is a value with no state after construction; Identify is safe for concurrent use
// as long as the configuration (and the Lookup functions) are.
package identity

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// Source names, as Identity.Source reports them.
const (
	SourceAPIKey = "api_key"
	SourceJWT    = "jwt"
	SourceIP     = "ip"
	SourceNone   = "none" // no source yielded anything (no IP source, and an unparsable peer)
)

// AnonymousKey is the Key of a request that no source identified.
const AnonymousKey = "anonymous"

// Identity is who sent a request.
type Identity struct {
	Client string // a configured client's name, or "" for an anonymous client
	Key    string // the rate-limit key: the client's name, or for an anonymous client its address group ("ip:203.0.113.7", "ip:2001:db8:1:2::/64")
	Source string // which source named it: SourceAPIKey, SourceJWT, SourceIP, or SourceNone
}

// CheckClientName reports whether name can name a configured client. A client's Key is its name,
// so the name must not be one that an anonymous client's key can take ("anonymous", "ip:…"):
// that client would share its quota with anonymous addresses.
func CheckClientName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("identity: a client's name must not be empty")
	case name == AnonymousKey || strings.HasPrefix(name, "ip:"):
		return fmt.Errorf("identity: client name %q is reserved for anonymous clients (%q and names starting with \"ip:\"); choose another", name, AnonymousKey)
	}
	return nil
}

// Anonymous reports whether no configured client was named.
func (id Identity) Anonymous() bool { return id.Client == "" }

// Source is one way of identifying a request. Identify reports ok == false when the source has
// nothing to say (no credential, or one that is invalid or unknown), so that the next source is
// asked. It must not modify r, nor keep the strings r returns after it returns (an engine may
// reuse their memory for the next request).
type Source interface {
	Identify(r Request) (id Identity, ok bool)
}

// Request is what a source reads of a request: its header fields and its peer's address (and,
// for a policy's key_by, a query parameter). The gateway's engines each provide one (HTTP adapts
// a net/http request), so that who a request comes from is decided the same way whichever engine
// received it.
type Request interface {
	// Header returns the first line of the named field, "" if there is none. Field names are
	// case-insensitive.
	Header(name string) string
	// HeaderValues returns every line of the named field, in the order received.
	HeaderValues(name string) []string
	// Peer returns the address of the connection's other end; ok is false when it has none
	// that is an IP address (a Unix socket, say).
	Peer() (addr netip.Addr, ok bool)
	// Query returns the first value of the named query parameter, unescaped, "" if there is
	// none (QueryValue of the raw query: every engine reads it the same way).
	Query(name string) string
}

// HTTP returns r as a Request. It does not allocate.
func HTTP(r *http.Request) Request { return httpRequest{r} }

// httpRequest is a one-pointer struct, so that it fits an interface without an allocation.
type httpRequest struct{ r *http.Request }

func (h httpRequest) Header(name string) string {
	if v := h.r.Header[name]; len(v) > 0 { // a canonical name: no canonicalisation, no allocation
		return v[0]
	}
	return h.r.Header.Get(name)
}

func (h httpRequest) HeaderValues(name string) []string { return h.r.Header.Values(name) }

func (h httpRequest) Peer() (netip.Addr, bool) { return ParsePeer(h.r.RemoteAddr) }

func (h httpRequest) Query(name string) string {
	if h.r.URL == nil {
		return ""
	}
	return QueryValue(h.r.URL.RawQuery, name)
}

// QueryValue returns the first value of the parameter name in raw, a URL's query without the
// "?", unescaped as url.ParseQuery does ("+" is a space), "" if there is none. Like ParseQuery it
// skips pairs that have a ";" or a bad escape. It allocates only to unescape, and the value it
// returns may share raw's memory.
func QueryValue(raw, name string) string {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" || strings.IndexByte(pair, ';') >= 0 {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		if !strings.ContainsAny(v, "%+") {
			return v
		}
		if uv, err := url.QueryUnescape(v); err == nil {
			return uv
		}
	}
	return ""
}

// Chain is an ordered list of sources; the first that yields an identity wins. Put an IP source
// last so that every request has a key.
type Chain []Source

// Identify asks each source in order and returns the first identity one yields. If none does
// (no IP source, or a peer address that cannot be parsed) it returns the shared anonymous
// identity, Key AnonymousKey.
func (c Chain) Identify(r Request) Identity {
	for _, s := range c {
		if id, ok := s.Identify(r); ok {
			return id
		}
	}
	return Identity{Key: AnonymousKey, Source: SourceNone}
}

// IdentifyClaims is Identify that also reads the named claims of the request's token, for
// policies keyed by a claim: claims[i] is the value of names[i] (see jwt.Source.IdentifyClaims) in
// the token of the first jwt source (a ClaimsSource), in order, whose token verifies, whoever its
// subject names, and whether or not that source named the client (a request named by its API key
// has its token read too); nil if no jwt source verifies a token. The identity is Identify's: a jwt source
// asked only for claims names nobody. Each source reads the token once.
func (c Chain) IdentifyClaims(r Request, names []string) (id Identity, claims []string) {
	found := false
	for _, s := range c {
		j, ok := s.(ClaimsSource)
		if !ok {
			if !found {
				id, found = s.Identify(r)
			}
			continue
		}
		if found && claims != nil {
			break
		}
		jid, ok, cl := j.IdentifyClaims(r, names)
		if claims == nil {
			claims = cl
		}
		if !found && ok {
			id, found = jid, true
		}
	}
	if !found {
		id = Identity{Key: AnonymousKey, Source: SourceNone}
	}
	return id, claims
}
