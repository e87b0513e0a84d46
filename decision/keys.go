package decision

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// The key of a policy with a key_by (config.KeyPart) is built from the request's attributes:
//
//	by:c9=partner-a:h#822b33ad87c148a0a20a5ba7cd5ebcaa:s10=/v1/orders
//
// "by", then for each element in order ":", a letter for the attribute (c client, h header,
// q query, p path, s path_prefix, m method, j jwt_claim, r remote_address) and its value:
//
//   - "-": absent (no such header, an empty one, no verified token, ...): one counter for all
//     requests without it;
//   - "*": present, for a shared element (only whether the request has it counts);
//   - "#" and 32 hex digits: the first 16 bytes of the value's SHA-256. Header, query and claim
//     values always (they can be credentials: a key never holds them in plain text, yet an
//     operator can find a value's counter: printf %s acme | sha256sum | cut -c1-32), and any
//     other value longer than MaxLiteral bytes or with a byte outside '!'..'~' or a brace
//     (which Redis Cluster would read as a hash tag);
//   - its length in decimal, "=" and the value itself: the client's key, the path or its
//     prefix, the method (a token of at most 16 characters), the masked remote address.
//
// Each value's form and length are written before it, so no two different tuples of values give
// the same key, and a key is at most MaxKeyLen bytes. It cannot be a client's key either (a
// client's name has no ':', an anonymous one starts "ip:"), and the store keeps its state under
// the policy's name besides: a policy's counters never meet another's.

// Bounds of a key_by key.
const (
	MaxLiteral = 128 // the longest value kept as it is; longer ones are hashed
	maxMethod  = 16  // the longest method kept as it is
	// MaxKeyLen bounds a key: "by", and per element ":", the letter, at most 3 digits, "=" and
	// MaxLiteral bytes.
	MaxKeyLen = 2 + config.MaxKeyParts*(1+1+3+1+MaxLiteral)
)

// keyLetters are the attributes' letters in keys, by config.KeyAttr.
var keyLetters = [...]byte{config.KeyClient: 'c', config.KeyHeader: 'h', config.KeyQuery: 'q', config.KeyPath: 'p',
	config.KeyPathPrefix: 's', config.KeyMethod: 'm', config.KeyJWTClaim: 'j', config.KeyRemoteAddress: 'r', config.KeyJSONBody: 'b'}

// attrs are the attributes of one request that keys are made of.
type attrs struct {
	who          identity.Identity
	r            identity.Request // nil (For): header, query, claims and address are absent
	method, path string
	claims       []string // the verified token's claims, in Policies.claimNames' order; nil: none
	model        string   // a usage route's body's model ("": none, or not a usage route)

	remote     string // the masked remote address, once read
	remoteRead bool
}

// keyed returns a copy of limits (shared by every request) with the Key of each limit whose
// policy has a key_by made from a's attributes.
func (p *Policies) keyed(limits []Limit, a *attrs) []Limit {
	out := make([]Limit, len(limits))
	copy(out, limits)
	for i := range out {
		if out[i].KeyBy != nil {
			out[i].Key = p.key(out[i].KeyBy, a)
		}
	}
	return out
}

// key returns the key of a request with attributes a under key_by parts (see the format above).
func (p *Policies) key(parts []config.KeyPart, a *attrs) string {
	b := make([]byte, 0, 2+len(parts)*(3+2*16))
	b = append(b, "by"...)
	for i := range parts {
		part := &parts[i]
		b = append(b, ':', keyLetters[part.Attr])
		switch part.Attr {
		case config.KeyClient:
			b = appendLiteral(b, a.who.Key)
		case config.KeyHeader:
			v := ""
			if a.r != nil {
				v = a.r.Header(part.Name)
			}
			b = appendSecret(b, v, part.Shared)
		case config.KeyQuery:
			v := ""
			if a.r != nil {
				v = a.r.Query(part.Name)
			}
			b = appendSecret(b, v, part.Shared)
		case config.KeyJWTClaim:
			v := ""
			if a.claims != nil {
				v = a.claims[p.claimIndex[part.Name]]
			}
			b = appendSecret(b, v, part.Shared)
		case config.KeyJSONBody: // (only model: config.keyPart)
			b = appendSecret(b, a.model, part.Shared)
		case config.KeyPath:
			b = appendLiteral(b, a.path)
		case config.KeyPathPrefix:
			b = appendLiteral(b, PathPrefix(a.path, part.Segments))
		case config.KeyMethod:
			if a.method != "" && (len(a.method) > maxMethod || !isToken(a.method)) {
				b = appendHash(b, a.method)
			} else {
				b = appendLiteral(b, a.method)
			}
		case config.KeyRemoteAddress:
			if !a.remoteRead {
				a.remoteRead = true
				if a.r != nil {
					if id, ok := p.ip.Identify(a.r); ok {
						a.remote = id.Key
					}
				}
			}
			b = appendLiteral(b, a.remote)
		}
	}
	return string(b)
}

// PathPrefix returns the first n segments of path: 2 of "/v1/orders/42" (and of "/v1/orders/")
// is "/v1/orders"; a path of fewer segments is itself ("/v1").
func PathPrefix(path string, n int) string {
	seen := 0
	for i := 0; i < len(path); i++ {
		if path[i] == '/' && i > 0 {
			if seen++; seen == n {
				return path[:i]
			}
		}
	}
	return path
}

// appendLiteral appends v as it is (its length, "=", v) if it is short and plain enough, else
// hashed; "" is absent.
func appendLiteral(b []byte, v string) []byte {
	if v == "" {
		return append(b, '-')
	}
	if len(v) > MaxLiteral || !plain(v) {
		return appendHash(b, v)
	}
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, '=')
	return append(b, v...)
}

// appendSecret appends a value that may be a credential: hashed, or only whether it is there
// when shared; "" is absent.
func appendSecret(b []byte, v string, shared bool) []byte {
	switch {
	case v == "":
		return append(b, '-')
	case shared:
		return append(b, '*')
	}
	return appendHash(b, v)
}

// appendHash appends "#" and the first 16 bytes of v's SHA-256 in hex.
func appendHash(b []byte, v string) []byte {
	sum := sha256.Sum256([]byte(v))
	b = append(b, '#')
	return hex.AppendEncode(b, sum[:16])
}

// plain reports whether every byte of v is printable ASCII other than a space or a brace.
func plain(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c > '~' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// isToken reports whether v is made of RFC 9110 token characters (what a method is).
func isToken(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' || c == '+' ||
			c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}
