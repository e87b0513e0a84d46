// This file reads the identity sources: api_key, jwt (and its public key), ip (trusted proxies
// and their prefixes).

package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// identity reads the identity sources; absent or null, the default: api_key, then ip.
func (p *parser) identity(top *mapping) []Identity {
	n := p.get(top, "identity")
	if n == nil {
		return []Identity{{APIKey: &APIKeySource{Header: DefaultAPIKeyHeader}}, {IP: defaultIP()}}
	}
	items, ok := p.seq(n, "", "identity")
	if !ok {
		p.identityBad = true
		return nil
	}
	if len(items) == 0 {
		p.errorf(n, "", nil, "identity is an empty list; list at least one source (api_key, jwt, ip), or leave it out for [api_key, ip]")
	}
	var out []Identity
	var ipAt *yaml.Node // the ip source: it always names a client, so no source after it is reached
	for i, item := range items {
		path := fmt.Sprintf("identity[%d]", i)
		at := item
		if item = p.deref(item); item == nil {
			p.errorf(at, path, nil, "is empty; want one of api_key, jwt, ip")
			p.identityBad = true
			continue
		}
		m := p.mapping(item, item, path, "")
		if m == nil {
			p.identityBad = true
			continue
		}
		p.checkKnown(m, path, identityKinds...)
		var kinds []*yaml.Node
		for _, k := range m.keys {
			if slices.Contains(identityKinds, k.Value) {
				kinds = append(kinds, k)
			}
		}
		switch {
		case len(kinds) == 0:
			if len(m.keys) == 0 {
				p.errorf(item, path, nil, "names no source; want one of api_key, jwt, ip")
			}
			p.identityBad = true
			continue
		case len(kinds) > 1:
			p.errorf(kinds[1], path, nil, "has both %s and %s; give each source its own list item", kinds[0].Value, kinds[1].Value)
			continue
		}
		if ipAt != nil {
			p.errorf(kinds[0], path, nil, "%s is never reached: the ip source at line %d always names the client", kinds[0].Value, ipAt.Line)
		}
		kind := kinds[0].Value
		id := Identity{Line: kinds[0].Line}
		src := p.get(m, kind)
		path += " " + kind
		switch kind {
		case "api_key":
			id.APIKey = p.apiKey(src, kinds[0], path)
		case "jwt":
			id.JWT = p.jwt(src, kinds[0], path)
		case "ip":
			id.IP = p.ip(src, kinds[0], path)
			ipAt = kinds[0]
		}
		out = append(out, id)
	}
	return out
}

func defaultIP() *IPSource {
	return &IPSource{IPv4Prefix: DefaultIPv4Prefix, IPv6Prefix: DefaultIPv6Prefix}
}

func (p *parser) header(m *mapping, path, def string) string {
	n := p.get(m, "header")
	if n == nil {
		return def
	}
	h, ok := p.str(n, path, "header")
	if !ok {
		return def
	}
	if !headerNameRE.MatchString(h) {
		p.errorf(n, path, nil, "header %q is not a header name", h)
		return def
	}
	return h
}

func (p *parser) apiKey(n, at *yaml.Node, path string) *APIKeySource {
	m := p.mapping(n, at, path, "")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, apiKeyFields...)
	return &APIKeySource{Header: p.header(m, path, DefaultAPIKeyHeader)}
}

func (p *parser) jwt(n, at *yaml.Node, path string) *JWTSource {
	m := p.mapping(n, at, path, "")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, jwtFields...)
	j := &JWTSource{Header: p.header(m, path, DefaultJWTHeader), Claim: DefaultJWTClaim}
	algN := p.get(m, "algorithms")
	algBad := false // an algorithm was rejected: the checks below would only add noise
	if algN != nil {
		if items, ok := p.seq(algN, path, "algorithms"); !ok {
			algBad = true
		} else {
			if len(items) == 0 {
				p.errorf(algN, path, nil, "algorithms is an empty list")
				algBad = true
			}
			for i, item := range items {
				field := fmt.Sprintf("algorithms[%d]", i)
				if item = p.deref(item); item == nil {
					p.errorf(items[i], path, nil, "%s is empty", field)
					continue
				}
				a, ok := p.str(item, path, field)
				if !ok {
					algBad = true
					continue
				}
				switch {
				case !slices.Contains(jwtAlgorithms, a):
					p.errorf(item, path, nil, "%s %q is not supported (want %s)", field, a, strings.Join(jwtAlgorithms, ", "))
					algBad = true
				case slices.Contains(j.Algorithms, a):
					p.errorf(item, path, nil, "%s %q is listed twice", field, a)
				default:
					j.Algorithms = append(j.Algorithms, a)
				}
			}
		}
	}
	secretN, keyN := p.get(m, "secret_env"), p.get(m, "public_key_file")
	if algN == nil { // the algorithms follow from the keys given: HS256, and the key's usual one
		if secretN == nil && keyN == nil {
			p.errorf(m.node, path, nil, "missing secret: give secret_env (HS256) or public_key_file (RS256, ES256, EdDSA)")
			return j
		}
		if secretN != nil {
			j.Algorithms = []string{"HS256"}
		}
	}
	if algBad {
		return j
	}
	hmac := slices.ContainsFunc(j.Algorithms, func(a string) bool { return strings.HasPrefix(a, "HS") })
	asym := slices.ContainsFunc(j.Algorithms, func(a string) bool { return !strings.HasPrefix(a, "HS") })
	if secretN != nil {
		if hmac {
			j.SecretEnv, j.Secret = p.env(secretN, path, "secret_env", "secret")
			if !j.Secret.IsZero() {
				for _, a := range j.Algorithms {
					if need := hmacMinSecrets[a]; need > 0 && len(j.Secret.Value()) < need {
						p.errorf(secretN, path, nil, "the secret in %s is %d bytes; %s needs at least %d (RFC 7518 §3.2)", j.SecretEnv, len(j.Secret.Value()), a, need)
						break
					}
				}
			}
		} else {
			p.errorf(secretN, path, nil, "secret_env has no use without an HS algorithm in algorithms")
		}
	} else if hmac {
		p.errorf(algN, path, nil, "missing secret: an HS algorithm needs secret_env, the environment variable that holds the secret")
	}
	if keyN != nil {
		if asym || algN == nil {
			p.publicKey(keyN, path, j, algN == nil)
		} else {
			p.errorf(keyN, path, nil, "public_key_file has no use without an RS, PS, ES or EdDSA algorithm in algorithms")
		}
	} else if asym {
		p.errorf(algN, path, nil, "missing key: RS, PS, ES and EdDSA algorithms need public_key_file")
	}
	if n := p.get(m, "claim"); n != nil {
		if s, ok := p.str(n, path, "claim"); ok {
			if s == "" {
				p.errorf(n, path, nil, "claim is empty")
			} else {
				j.Claim = s
			}
		}
	}
	if n := p.get(m, "issuer"); n != nil {
		j.Issuer, _ = p.str(n, path, "issuer")
	}
	if n := p.get(m, "audience"); n != nil {
		j.Audience, _ = p.str(n, path, "audience")
	}
	if n := p.get(m, "leeway"); n != nil {
		if d, ok := p.duration(n, path, "leeway"); ok {
			if d < 0 {
				p.errorf(n, path, nil, "leeway %v must be ≥ 0", d)
			} else {
				j.Leeway = d
			}
		}
	}
	return j
}

// publicKey loads the PEM public key (PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE) and checks it
// against the algorithms; derive sets the algorithms from the key instead.
func (p *parser) publicKey(n *yaml.Node, path string, j *JWTSource, derive bool) {
	name, ok := p.str(n, path, "public_key_file")
	if !ok {
		return
	}
	j.PublicKeyFile = p.path(name)
	data, err := readFile(j.PublicKeyFile)
	if err != nil {
		p.errorf(n, path, err, "public_key_file %q cannot be read: %v", j.PublicKeyFile, err)
		return
	}
	block, _ := pem.Decode(data)
	if block == nil {
		p.errorf(n, path, nil, "public_key_file %q is not PEM (-----BEGIN PUBLIC KEY-----)", j.PublicKeyFile)
		return
	}
	var key any
	switch block.Type {
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			key = cert.PublicKey
		}
	default:
		p.errorf(n, path, nil, "public_key_file %q holds a %q; want a PUBLIC KEY (or a CERTIFICATE)", j.PublicKeyFile, block.Type)
		return
	}
	if err != nil {
		p.errorf(n, path, err, "public_key_file %q: %v", j.PublicKeyFile, err)
		return
	}
	var fits func(alg string) bool
	var kind, natural string
	switch k := key.(type) {
	case *rsa.PublicKey:
		kind, natural = "an RSA key", "RS256"
		fits = func(alg string) bool { return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS") }
	case *ecdsa.PublicKey:
		curves := map[elliptic.Curve]string{elliptic.P256(): "ES256", elliptic.P384(): "ES384", elliptic.P521(): "ES512"}
		natural = curves[k.Curve]
		kind = "an ECDSA " + k.Curve.Params().Name + " key"
		if natural == "" {
			p.errorf(n, path, nil, "public_key_file %q holds %s; ES256, ES384 and ES512 need P-256, P-384 or P-521", j.PublicKeyFile, kind)
			return
		}
		fits = func(alg string) bool { return alg == natural }
	case ed25519.PublicKey:
		kind, natural = "an Ed25519 key", "EdDSA"
		fits = func(alg string) bool { return alg == "EdDSA" }
	default:
		p.errorf(n, path, nil, "public_key_file %q holds a %T; want an RSA, ECDSA or Ed25519 key", j.PublicKeyFile, key)
		return
	}
	if derive {
		j.Algorithms = append(j.Algorithms, natural)
	}
	for _, a := range j.Algorithms {
		if !strings.HasPrefix(a, "HS") && !fits(a) {
			p.errorf(n, path, nil, "public_key_file %q holds %s, which cannot verify %s", j.PublicKeyFile, kind, a)
			return
		}
	}
	j.PublicKey = key
}

func (p *parser) ip(n, at *yaml.Node, path string) *IPSource {
	m := p.mapping(n, at, path, "")
	s := defaultIP()
	if m == nil {
		return s
	}
	p.checkKnown(m, path, ipFields...)
	if n := p.get(m, "trusted_proxies"); n != nil {
		if items, ok := p.seq(n, path, "trusted_proxies"); ok {
			for i, item := range items {
				field := fmt.Sprintf("trusted_proxies[%d]", i)
				if item = p.deref(item); item == nil {
					p.errorf(items[i], path, nil, "%s is empty", field)
					continue
				}
				v, ok := p.str(item, path, field)
				if !ok {
					continue
				}
				if pfx, ok := p.prefix(item, path, field, v); ok {
					s.TrustedProxies = append(s.TrustedProxies, pfx)
				}
			}
		}
	}
	bits := func(field string, lo, hi int, dst *int) {
		if n := p.get(m, field); n != nil {
			if v, ok := p.int(n, path, field); ok {
				if v < int64(lo) || v > int64(hi) {
					p.errorf(n, path, nil, "%s %d must be from %d to %d", field, v, lo, hi)
				} else {
					*dst = int(v)
				}
			}
		}
	}
	bits("ipv4_prefix", 1, 32, &s.IPv4Prefix)
	bits("ipv6_prefix", 1, 128, &s.IPv6Prefix)
	if n := p.get(m, "forwarded_header"); n != nil {
		if v, ok := p.str(n, path, "forwarded_header"); ok {
			switch {
			case strings.EqualFold(v, "X-Forwarded-For"):
				s.ForwardedHeader = "X-Forwarded-For"
			case strings.EqualFold(v, "Forwarded"):
				s.ForwardedHeader = "Forwarded"
			default:
				p.errorf(n, path, nil, "forwarded_header %q must be X-Forwarded-For or Forwarded, the one header your proxies write (left out: X-Forwarded-For)", v)
			}
		}
	}
	return s
}

// prefix parses a CIDR or a single address.
func (p *parser) prefix(n *yaml.Node, path, field, v string) (netip.Prefix, bool) {
	if strings.Contains(v, "/") {
		pfx, err := netip.ParsePrefix(v)
		if err != nil {
			p.errorf(n, path, nil, "%s %q is not a CIDR (e.g. 10.0.0.0/8, fd00::/8)", field, v)
			return netip.Prefix{}, false
		}
		if pfx.Addr().Zone() != "" {
			p.errorf(n, path, nil, "%s %q: a CIDR takes no zone", field, v)
			return netip.Prefix{}, false
		}
		if m := pfx.Masked(); m != pfx {
			p.errorf(n, path, nil, "%s %q has bits set past the prefix; did you mean %s?", field, v, m)
			return netip.Prefix{}, false
		}
		if pfx.Addr().Is4In6() {
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), max(0, pfx.Bits()-96))
		}
		return pfx, true
	}
	addr, err := netip.ParseAddr(v)
	if err != nil || addr.Zone() != "" {
		p.errorf(n, path, nil, "%s %q is not an IP address or CIDR (e.g. 10.0.0.1, 10.0.0.0/8)", field, v)
		return netip.Prefix{}, false
	}
	addr = addr.Unmap()
	return netip.PrefixFrom(addr, addr.BitLen()), true
}
