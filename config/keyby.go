// This file reads a policy's key_by: the attributes of a request its counter is split by (the
// client, a header, a query parameter, the path or a prefix of it, the method, a JWT claim, the
// remote address), and describes them (KeyPart) for the decision layer, which computes the key.

package config

import (
	"fmt"
	"github.com/sluicehq/sluice/internal/suggest"
	"net/textproto"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// KeyAttr is an attribute of a request that a policy's counter can be split by.
type KeyAttr uint8

const (
	KeyClient        KeyAttr = iota + 1 // the client's key: its name, or an anonymous client's masked address
	KeyHeader                           // a header's value (KeyPart.Name, canonical)
	KeyQuery                            // a query parameter's value (KeyPart.Name)
	KeyPath                             // the request's path, as routes match it
	KeyPathPrefix                       // its first KeyPart.Segments segments: 2 of /v1/orders/42 is /v1/orders
	KeyMethod                           // the request's method
	KeyJWTClaim                         // a claim (KeyPart.Name) of the request's verified token
	KeyRemoteAddress                    // the client's address as the ip source masks it, whoever names the client
	KeyJSONBody                         // a field (KeyPart.Name) of a usage route's JSON request body: only "model"
)

// keyAttrNames are the attributes as key_by spells them, by KeyAttr.
var keyAttrNames = [...]string{KeyClient: "client", KeyHeader: "header", KeyQuery: "query", KeyPath: "path",
	KeyPathPrefix: "path_prefix", KeyMethod: "method", KeyJWTClaim: "jwt_claim", KeyRemoteAddress: "remote_address", KeyJSONBody: "json_body"}

func (a KeyAttr) String() string {
	if int(a) < len(keyAttrNames) && keyAttrNames[a] != "" {
		return keyAttrNames[a]
	}
	return fmt.Sprintf("KeyAttr(%d)", uint8(a))
}

// KeyPart is one element of a policy's key_by. Each splits the policy's counter by the
// attribute's value: requests with different values count apart. A request without the
// attribute (no such header or parameter, an empty one, no verified token or no such claim in
// it, a peer with no IP address) counts under a value of its own, "absent", shared by every
// request without it: leaving a header out never escapes a limit.
type KeyPart struct {
	Attr     KeyAttr
	Name     string // KeyHeader: the header (canonical: X-Tenant); KeyQuery: the parameter; KeyJWTClaim: the claim
	Segments int    // KeyPathPrefix: how many leading segments, 1 to MaxPathSegments
	// Shared (header, query and jwt_claim only): the value does not split the counter, only
	// whether the request has one does: every request that has the attribute, whatever its
	// value, shares one counter, and those without it share another.
	Shared bool
	Line   int
}

// Bounds of key_by.
const (
	MaxKeyParts     = 8  // elements of one key_by
	MaxPathSegments = 32 // path_prefix
	maxKeyNameLen   = 128
)

// keyBy reads a policy's key_by (a list; not null). The default, [client], is nil.
func (p *parser) keyBy(n *yaml.Node, path string, c *Config) []KeyPart {
	items, ok := p.seq(n, path, "key_by")
	if !ok {
		return nil
	}
	if len(items) > MaxKeyParts {
		p.errorf(n, path, nil, "key_by has %d elements; at most %d", len(items), MaxKeyParts)
		return nil
	}
	parts := make([]KeyPart, 0, len(items))
	at := map[string]*yaml.Node{} // each attribute (header by name, ...) once
	for i, item := range items {
		field := fmt.Sprintf("key_by[%d]", i)
		if item = p.deref(item); item == nil {
			p.errorf(items[i], path, nil, "%s is empty; want one of %s", field, attrList)
			continue
		}
		part, ok := p.keyPart(item, path, field, c)
		if !ok {
			continue
		}
		id := part.Attr.String()
		switch part.Attr {
		case KeyHeader, KeyQuery, KeyJWTClaim, KeyJSONBody:
			id += " " + part.Name
		case KeyPath, KeyPathPrefix:
			id = "path" // path_prefix of any length and path split by the same thing
		}
		if prev, ok := at[id]; ok {
			what := part.Attr.String()
			if part.Name != "" {
				what += " " + part.Name
			}
			if id == "path" {
				p.errorf(item, path, nil, "%s %s: the path already splits the counter at line %d (path or one path_prefix: keep one)", field, what, prev.Line)
			} else {
				p.errorf(item, path, nil, "%s %s is already in key_by at line %d", field, what, prev.Line)
			}
			continue
		}
		at[id] = item
		parts = append(parts, part)
	}
	if len(parts) == 1 && parts[0].Attr == KeyClient {
		return nil // the default: counted per client, under the client's own key
	}
	return parts
}

// attrList lists the attributes for errors.
var attrList = "client, header, query, path, path_prefix, method, jwt_claim, json_body, remote_address"

// keyPart reads one element of key_by: an attribute without an argument (client, path, method,
// remote_address), or a mapping of one attribute with its argument, and shared.
func (p *parser) keyPart(item *yaml.Node, path, field string, c *Config) (KeyPart, bool) {
	part := KeyPart{Line: item.Line}
	if item.Kind == yaml.ScalarNode {
		switch item.Value {
		case "client":
			part.Attr = KeyClient
		case "path":
			part.Attr = KeyPath
		case "method":
			part.Attr = KeyMethod
		case "remote_address":
			part.Attr = KeyRemoteAddress
		case "header", "query", "path_prefix", "jwt_claim", "json_body":
			p.errorf(item, path, nil, "%s %s needs its argument: write %s", field, item.Value, map[string]string{
				"header": "- header: X-Tenant", "query": "- query: region", "path_prefix": "- path_prefix: 2", "jwt_claim": "- jwt_claim: org",
				"json_body": "- json_body: model"}[item.Value])
			return part, false
		default:
			msg := fmt.Sprintf("%s %s is not an attribute (want %s)", field, literal(item), attrList)
			if near := suggest.Field(item.Value, keyByFields); near != "" && near != "shared" {
				msg = fmt.Sprintf("%s %s is not an attribute; did you mean %q?", field, literal(item), near)
			}
			p.errorf(item, path, nil, "%s", msg)
			return part, false
		}
		return part, true
	}
	sub := path + " " + field
	m := p.mapping(item, item, sub, "")
	if m == nil {
		return part, false
	}
	p.checkKnown(m, sub, keyByFields...)
	var attrs []*yaml.Node
	for _, k := range m.keys {
		if k.Value != "shared" && slices.Contains(keyByFields, k.Value) {
			attrs = append(attrs, k)
		}
	}
	switch {
	case len(attrs) == 0:
		if len(m.keys) == 0 || m.has("shared") {
			p.errorf(item, sub, nil, "names no attribute; want one of %s", attrList)
		}
		return part, false
	case len(attrs) > 1:
		p.errorf(attrs[1], sub, nil, "has both %s and %s; give each attribute its own list item", attrs[0].Value, attrs[1].Value)
		return part, false
	}
	key := attrs[0]
	v := p.get(m, key.Value)
	good := true
	switch key.Value {
	case "client", "path", "method", "remote_address":
		p.errorf(key, sub, nil, "%s takes no value: write - %s", key.Value, key.Value)
		return part, false
	case "header":
		part.Attr = KeyHeader
		if h, ok := p.keyName(v, key, sub, "header"); !ok {
			good = false
		} else if !headerNameRE.MatchString(h) {
			p.errorf(v, sub, nil, "header %q is not a header name", h)
			good = false
		} else {
			part.Name = textproto.CanonicalMIMEHeaderKey(h)
		}
	case "query":
		part.Attr = KeyQuery
		if q, ok := p.keyName(v, key, sub, "query"); ok {
			part.Name = q
		} else {
			good = false
		}
	case "jwt_claim":
		part.Attr = KeyJWTClaim
		if cl, ok := p.keyName(v, key, sub, "jwt_claim"); !ok {
			good = false
		} else {
			part.Name = cl
			if !p.identityBad && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.JWT != nil }) {
				p.errorf(v, sub, nil, "jwt_claim %q is never read: identity has no jwt source to verify the token", cl)
				good = false
			}
		}
	case "json_body":
		part.Attr = KeyJSONBody
		if f, ok := p.keyName(v, key, sub, "json_body"); !ok {
			good = false
		} else if f != "model" {
			p.errorf(v, sub, nil, "json_body %q: only model is read from a request's body (a usage route's; never the prompt)", f)
			good = false
		} else {
			part.Name = f
		}
	case "path_prefix":
		part.Attr = KeyPathPrefix
		if v == nil {
			p.errorf(key, sub, nil, "path_prefix needs the number of segments (2: /v1/orders of /v1/orders/42)")
			good = false
		} else if n, ok := p.int(v, sub, "path_prefix"); !ok {
			good = false
		} else if n < 1 || n > MaxPathSegments {
			p.errorf(v, sub, nil, "path_prefix %d must be from 1 to %d: the number of leading segments (2: /v1/orders of /v1/orders/42)", n, MaxPathSegments)
			good = false
		} else {
			part.Segments = int(n)
		}
	}
	if sn := p.get(m, "shared"); sn != nil {
		if b, ok := p.bool(sn, sub, "shared"); !ok {
			good = false
		} else if b {
			switch part.Attr {
			case KeyHeader, KeyQuery, KeyJWTClaim:
				part.Shared = true
			default:
				p.errorf(sn, sub, nil, "shared has no meaning for %s: every request has one, so one shared counter is leaving %s out", key.Value, key.Value)
				good = false
			}
		}
	}
	return part, good
}

// keyName reads the name a header, query or jwt_claim element takes.
func (p *parser) keyName(v, key *yaml.Node, path, field string) (string, bool) {
	if v == nil {
		p.errorf(key, path, nil, "%s needs a name", field)
		return "", false
	}
	s, ok := p.str(v, path, field)
	if !ok {
		return "", false
	}
	switch {
	case strings.TrimSpace(s) == "":
		p.errorf(v, path, nil, "%s is empty", field)
		return "", false
	case len(s) > maxKeyNameLen:
		p.errorf(v, path, nil, "%s is longer than %d characters", field, maxKeyNameLen)
		return "", false
	}
	return s, true
}
