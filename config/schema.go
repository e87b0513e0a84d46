package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// parse is Parse with the environment as a parameter, for tests.
func parse(data []byte, name string, getenv func(string) (string, bool)) (cfg *Config, err error) {
	p := &parser{file: name, getenv: getenv}
	if dir := filepath.Dir(name); dir != "." {
		p.dir = dir
	}
	root, serr := decodeYAML(data, name)
	if serr != nil {
		return nil, Errors{serr}
	}
	cfg = p.config(root)
	if len(p.errs) > 0 {
		return nil, p.errs.sorted()
	}
	return cfg, nil
}

// decodeYAML parses data into its one document's root node (nil for an empty document).
func decodeYAML(data []byte, name string) (root *yaml.Node, e *Error) {
	defer func() {
		// yaml.v3 recovers its own failures; anything else is a bug in it that a bad file
		// triggered, and a bad file is an error, never a crash.
		if r := recover(); r != nil {
			root, e = nil, &Error{File: name, Msg: fmt.Sprintf("YAML: the parser failed: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(name, data, err)
	}
	var second yaml.Node
	if err := dec.Decode(&second); err == nil {
		return nil, &Error{File: name, Line: second.Line, Column: second.Column, Msg: "a second YAML document (after ---); a configuration is one document"}
	} else if !errors.Is(err, io.EOF) {
		return nil, syntaxError(name, data, err)
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return nil, nil
}

// Field names, in the order docs/config.md lists them.
var (
	topFields     = []string{"listen", "admin_listen", "upstream", "tls", "store", "identity", "policies", "default_policy", "clients", "routes", "limits", "server", "rls", "forward_auth"}
	tlsFields     = []string{"cert_file", "key_file"}
	storeFields   = []string{"type", "addrs", "url", "username", "password", "password_env", "prefix", "timeout", "on_error", "local_share", "max_keys"}
	redisOnly     = []string{"addrs", "url", "username", "password", "password_env", "prefix", "timeout", "on_error", "local_share"}
	identityKinds = []string{"api_key", "jwt", "ip"}
	apiKeyFields  = []string{"header"}
	jwtFields     = []string{"header", "algorithms", "secret_env", "public_key_file", "claim", "issuer", "audience", "leeway"}
	ipFields      = []string{"trusted_proxies", "ipv4_prefix", "ipv6_prefix", "forwarded_header"}
	policyFields  = []string{"name", "algorithm", "limit", "period", "burst", "dry_run"}
	clientFields  = []string{"name", "api_key_sha256", "jwt_subject", "policy"}
	routeFields   = []string{"method", "path_prefix", "cost", "policy", "scope"}
	limitsFields  = []string{"max_delay", "legacy_headers"}
	serverFields  = []string{"body_timeout", "body_min_rate", "drain_timeout"}
	rlsFields     = []string{"listen", "envoy_config"}
	faFields      = []string{"refused_status"}
	jwtAlgorithms = []string{"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
	policyNameRE  = regexp.MustCompile(`^[a-z0-9._-]+$`)
	clientNameRE  = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerNameRE  = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$") // an RFC 9110 token
	maxNameLen    = 64
	// reservedClientName is the key the gateway gives requests that no identity source names
	// (identity.AnonymousKey); a client so named would share their quota.
	reservedClientName = "anonymous"
	hmacMinSecrets     = map[string]int{"HS256": 32, "HS384": 48, "HS512": 64} // RFC 7518 §3.2: at least the hash's size
)

// refs remembers what the file refers to, checked once every policy is known.
type refs struct {
	lists []refList             // every list of policy names
	scope map[*Route]*yaml.Node // where each route's scope is written
	cost  map[*Route]*yaml.Node // where each route's cost is written (absent: the default)
	route map[*Route]string     // each route's path, for errors
}

// refList is one list of policy names and where its resolution goes.
type refList struct {
	path, field string
	list        []ref
	dst         *[]string
}

// config walks the document's root.
func (p *parser) config(root *yaml.Node) *Config {
	c := &Config{
		File: p.file, Listen: DefaultListen, AdminListen: DefaultAdminListen,
		Store:       Store{Type: StoreMemory, Prefix: DefaultStorePrefix, Timeout: DefaultStoreTimeout, LocalShare: DefaultLocalShare},
		Limits:      Limits{MaxDelay: DefaultMaxDelay},
		Server:      Server{BodyTimeout: DefaultBodyTimeout, BodyMinRate: DefaultBodyMinRate, DrainTimeout: DefaultDrainTimeout},
		ForwardAuth: ForwardAuth{RefusedStatus: DefaultRefusedStatus},
	}
	start := &yaml.Node{Line: 1, Column: 1} // where an empty file's problems are
	if root != nil {
		start = root
	}
	root = p.deref(root)
	if root != nil && root.Kind != yaml.MappingNode {
		p.errorf(root, "", nil, "the configuration must be a mapping (listen: ..., upstream: ...), not %s", describe(root))
		return c
	}
	m := p.mapping(root, start, "", "")
	if m != nil {
		// Top-level fields that start with x- are the file's own: a place for YAML anchors.
		m.keys = slices.DeleteFunc(m.keys, func(k *yaml.Node) bool { return strings.HasPrefix(k.Value, "x-") })
	}
	p.checkKnown(m, "", topFields...)

	if n := p.get(m, "listen"); n != nil {
		if n.Kind == yaml.ScalarNode && n.Value == "" && n.Tag != "!!null" {
			c.Listen = "" // no proxy listener: sluice answers only on the admin listener and rls
		} else if s, ok := p.hostPort(n, "", "listen"); ok {
			c.Listen = s
		}
	}
	if m.has("admin_listen") {
		if n := p.get(m, "admin_listen"); n != nil {
			if n.Kind == yaml.ScalarNode && n.Value == "" {
				c.AdminListen = ""
			} else if s, ok := p.hostPort(n, "", "admin_listen"); ok {
				c.AdminListen = s
			}
		}
	}
	if c.AdminListen != "" && c.AdminListen == c.Listen {
		p.errorf(m.values["admin_listen"], "", nil, "admin_listen %q is also listen; give them different ports", c.AdminListen)
	}
	if n := p.get(m, "upstream"); n != nil {
		c.Upstream = p.upstream(n)
	} else if c.Listen != "" {
		p.errorf(m.node, "", nil, "upstream is required: the URL of the API behind sluice, e.g. upstream: http://127.0.0.1:9000")
	}
	if n := p.get(m, "tls"); n != nil {
		c.TLS = p.tls(n)
	}
	if n := p.get(m, "store"); n != nil {
		p.store(n, &c.Store)
	}
	c.Identity = p.identity(m)

	r := refs{scope: map[*Route]*yaml.Node{}, cost: map[*Route]*yaml.Node{}, route: map[*Route]string{}}
	c.policies = map[string]*Policy{}
	if n := p.get(m, "policies"); n != nil {
		p.policies(n, c)
	}
	if n := p.get(m, "default_policy"); n != nil {
		r.lists = append(r.lists, refList{"", "default_policy", p.names(n, "", "default_policy"), &c.DefaultPolicy})
	}
	if n := p.get(m, "clients"); n != nil {
		p.clients(n, c, &r)
	}
	if n := p.get(m, "routes"); n != nil {
		p.routes(n, c, &r)
	}
	if n := p.get(m, "limits"); n != nil {
		p.limits(n, &c.Limits)
	}
	if n := p.get(m, "server"); n != nil {
		p.server(n, &c.Server)
	}
	if n := p.get(m, "rls"); n != nil {
		c.RLS = p.rls(n)
	}
	if n := p.get(m, "forward_auth"); n != nil {
		p.forwardAuth(n, &c.ForwardAuth)
	}
	if c.RLS != nil && c.RLS.Listen != "" && (c.RLS.Listen == c.Listen || c.RLS.Listen == c.AdminListen) {
		p.errorf(m.values["rls"], "rls", nil, "listen %q is also another listener's; give it a port of its own", c.RLS.Listen)
	}
	p.references(c, &r)
	if len(p.errs) == 0 {
		p.resolveAll(c, &r)
	}
	return c
}

// hostPort reads a listen address: host:port, host may be empty (every interface) or a name,
// port 0 picks a free one.
func (p *parser) hostPort(n *yaml.Node, path, field string) (string, bool) {
	s, ok := p.str(n, path, field)
	if !ok {
		return "", false
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		p.errorf(n, path, nil, "%s %q is not host:port (e.g. 127.0.0.1:8080, :8080)", field, s)
		return "", false
	}
	if v, err := strconv.ParseUint(port, 10, 16); err != nil || (v == 0 && port != "0") {
		p.errorf(n, path, nil, "%s %q: port %q must be a number from 0 to 65535", field, s, port)
		return "", false
	}
	return s, true
}

func (p *parser) upstream(n *yaml.Node) *url.URL {
	s, ok := p.str(n, "", "upstream")
	if !ok {
		return nil
	}
	if !strings.Contains(s, "://") {
		p.errorf(n, "", nil, "upstream %q must be an http:// or https:// URL", s)
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		p.errorf(n, "", nil, "upstream %q is not a URL: %v", s, err)
		return nil
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		p.errorf(n, "", nil, "upstream %q must be an http:// or https:// URL", s)
	case u.Host == "" || u.Hostname() == "":
		p.errorf(n, "", nil, "upstream %q has no host", s)
	case u.User != nil:
		p.errorf(n, "", nil, "upstream must not contain a user or password")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		p.errorf(n, "", nil, "upstream %q must not have a query or fragment", s)
	default:
		if port := u.Port(); port != "" {
			if v, err := strconv.ParseUint(port, 10, 16); err != nil || v == 0 {
				p.errorf(n, "", nil, "upstream %q: port %q must be a number from 1 to 65535", s, port)
				return nil
			}
		}
		return u
	}
	return nil
}

func (p *parser) tls(n *yaml.Node) *TLS {
	m := p.mapping(n, n, "", "tls")
	if m == nil {
		return nil
	}
	p.checkKnown(m, "tls", tlsFields...)
	var t TLS
	certN, keyN := p.get(m, "cert_file"), p.get(m, "key_file")
	if certN != nil {
		t.CertFile, _ = p.str(certN, "tls", "cert_file")
	}
	if keyN != nil {
		t.KeyFile, _ = p.str(keyN, "tls", "key_file")
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		if certN == nil && keyN == nil {
			return nil
		}
		p.errorf(m.node, "tls", nil, "cert_file and key_file are required (or leave tls out)")
		return nil
	case t.KeyFile == "":
		p.errorf(m.node, "tls", nil, "key_file is required with cert_file")
		return nil
	case t.CertFile == "":
		p.errorf(m.node, "tls", nil, "cert_file is required with key_file")
		return nil
	}
	t.CertFile, t.KeyFile = p.path(t.CertFile), p.path(t.KeyFile)
	cert, err := readFile(t.CertFile)
	if err != nil {
		p.errorf(certN, "tls", err, "cert_file %q cannot be read: %v", t.CertFile, err)
	}
	key, kerr := readFile(t.KeyFile)
	if kerr != nil {
		p.errorf(keyN, "tls", kerr, "key_file %q cannot be read: %v", t.KeyFile, kerr)
	}
	if err != nil || kerr != nil {
		return nil
	}
	// Parsed and dropped: the private key stays out of the Config (and so out of any printout).
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		p.errorf(certN, "tls", err, "cert_file and key_file are not a PEM certificate and its private key: %v", err)
		return nil
	}
	return &t
}

func (p *parser) store(n *yaml.Node, s *Store) {
	const path = "store"
	m := p.mapping(n, n, "", "store")
	if m == nil {
		return
	}
	p.checkKnown(m, path, storeFields...)
	if n := p.get(m, "type"); n != nil {
		if t, ok := p.str(n, path, "type"); ok {
			switch t {
			case StoreMemory, StoreRedis:
				s.Type = t
			default:
				p.errorf(n, path, nil, "type %q must be memory or redis", t)
				s.Type = "" // unknown: check the other fields for themselves only
			}
		}
	}
	defer func() {
		if s.Type == "" {
			s.Type = StoreMemory
		}
	}()
	if s.Type == StoreMemory {
		for _, k := range m.keys {
			if slices.Contains(redisOnly, k.Value) {
				p.errorf(k, path, nil, "%s has no meaning for the memory store (is type: redis missing?)", k.Value)
			}
		}
	}
	if n := p.get(m, "addrs"); n != nil {
		if items, ok := p.seq(n, path, "addrs"); ok {
			if len(items) == 0 {
				p.errorf(n, path, nil, "addrs is an empty list")
			}
			for i, item := range items {
				field := fmt.Sprintf("addrs[%d]", i)
				if item = p.deref(item); item == nil {
					p.errorf(items[i], path, nil, "%s is empty", field)
					continue
				}
				if a, ok := p.str(item, path, field); ok {
					if host, port, err := net.SplitHostPort(a); err != nil || host == "" {
						p.errorf(item, path, nil, "%s %q is not host:port (e.g. 127.0.0.1:6379)", field, a)
					} else if v, err := strconv.ParseUint(port, 10, 16); err != nil || v == 0 {
						p.errorf(item, path, nil, "%s %q: port %q must be a number from 1 to 65535", field, a, port)
					} else {
						s.Addrs = append(s.Addrs, a)
					}
				}
			}
		}
	}
	urlN := p.get(m, "url")
	if urlN != nil {
		if raw, ok := p.secretStr(urlN, path, "url"); ok {
			s.URL = p.redisURL(urlN, raw)
		}
	}
	if n := p.get(m, "username"); n != nil {
		s.Username, _ = p.str(n, path, "username")
	}
	pwN, envN := p.get(m, "password"), p.get(m, "password_env")
	if pwN != nil && envN != nil {
		p.errorf(envN, path, nil, "password_env and password are both set; keep one (password_env keeps the password out of the file)")
	} else if pwN != nil {
		if pw, ok := p.secretStr(pwN, path, "password"); ok {
			s.Password = NewSecret(pw)
		}
	} else if envN != nil {
		s.PasswordEnv, s.Password = p.env(envN, path, "password_env", "password")
	}
	if n := p.get(m, "prefix"); n != nil {
		s.Prefix, _ = p.str(n, path, "prefix")
	}
	if n := p.get(m, "timeout"); n != nil {
		if d, ok := p.duration(n, path, "timeout"); ok {
			if d <= 0 {
				p.errorf(n, path, nil, "timeout %v must be > 0", d)
			} else {
				s.Timeout = d
			}
		}
	}
	if n := p.get(m, "on_error"); n != nil {
		if v, ok := p.str(n, path, "on_error"); ok {
			switch v {
			case "fail-closed":
				s.OnError = sluice.FailClosed
			case "fail-open":
				s.OnError = sluice.FailOpen
			case "local":
				s.OnError = sluice.FailLocal
			default:
				p.errorf(n, path, nil, "on_error %q must be fail-open, fail-closed or local", v)
			}
		}
	}
	if n := p.get(m, "local_share"); n != nil {
		if v, ok := p.float(n, path, "local_share"); ok {
			if !(v > 0 && v <= 1) {
				p.errorf(n, path, nil, "local_share %s must be in (0, 1]: this instance's share of each policy while Redis is down", n.Value)
			} else {
				s.LocalShare = v
			}
		}
	}
	if n := p.get(m, "max_keys"); n != nil {
		if v, ok := p.int(n, path, "max_keys"); ok {
			if v < 0 || v > 1<<40 {
				p.errorf(n, path, nil, "max_keys %d must be from 0 (the default, %d) to 2^40", v, DefaultMaxKeys)
			} else {
				s.MaxKeys = int(v)
			}
		}
	}
	if s.Type == StoreRedis {
		switch {
		case len(s.Addrs) == 0 && s.URL == "" && !m.has("addrs") && urlN == nil:
			p.errorf(m.node, path, nil, "the redis store needs addrs (e.g. addrs: [127.0.0.1:6379]) or url")
		case m.has("addrs") && urlN != nil:
			p.errorf(urlN, path, nil, "url and addrs are both set; give one")
		}
	}
}

// redisURL checks a redis:// or rediss:// URL. It never echoes the URL, which may hold a user.
func (p *parser) redisURL(n *yaml.Node, raw string) string {
	const path = "store"
	u, err := url.Parse(raw)
	if err != nil {
		p.errorf(n, path, nil, "url is not a URL (e.g. redis://127.0.0.1:6379/0)")
		return ""
	}
	switch {
	case u.Scheme != "redis" && u.Scheme != "rediss":
		p.errorf(n, path, nil, "url must start with redis:// or rediss:// (TLS), not %q", u.Scheme+"://")
	case u.Hostname() == "":
		p.errorf(n, path, nil, "url has no host (e.g. redis://127.0.0.1:6379/0)")
	case u.User != nil && func() bool { _, set := u.User.Password(); return set }():
		p.errorf(n, path, nil, "url must not contain the password; use password_env (or password)")
	default:
		return raw
	}
	return ""
}

// env reads the environment variable named by n; secret names it in errors ("password").
func (p *parser) env(n *yaml.Node, path, field, secret string) (string, Secret) {
	name, ok := p.str(n, path, field)
	if !ok {
		return "", Secret{}
	}
	if !envNameRE.MatchString(name) {
		p.errorf(n, path, nil, "%s %q is not an environment variable name", field, name)
		return "", Secret{}
	}
	v, _ := p.getenv(name)
	if v == "" {
		p.errorf(n, path, nil, "missing %s: the environment variable %s named by %s is unset or empty", secret, name, field)
		return name, Secret{}
	}
	return name, NewSecret(v)
}

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

// itemPath is the path of a list's item i, with its name if it has one: policies[2] "gold".
func (p *parser) itemPath(list string, i int, m *mapping) string {
	path := fmt.Sprintf("%s[%d]", list, i)
	if n := p.get(m, "name"); n != nil && n.Kind == yaml.ScalarNode && n.Value != "" {
		v := n.Value
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		path += " " + strconv.Quote(v)
	}
	return path
}

// listItems reads a list of mappings, calling f for each one.
func (p *parser) listItems(n *yaml.Node, field string, f func(i int, item *yaml.Node, m *mapping)) {
	items, ok := p.seq(n, "", field)
	if !ok {
		return
	}
	for i, item := range items {
		at := item
		if item = p.deref(item); item == nil {
			p.errorf(at, fmt.Sprintf("%s[%d]", field, i), nil, "is empty")
			continue
		}
		if m := p.mapping(item, item, fmt.Sprintf("%s[%d]", field, i), ""); m != nil {
			f(i, item, m)
		}
	}
}

// name reads a required name that must match re and be unique among seen.
func (p *parser) name(m *mapping, path string, re *regexp.Regexp, chars string, seen map[string]*yaml.Node) (string, bool) {
	n := p.get(m, "name")
	if n == nil {
		p.errorf(m.node, path, nil, "name is required")
		return "", false
	}
	s, ok := p.str(n, path, "name")
	if !ok {
		return "", false
	}
	switch {
	case !re.MatchString(s):
		p.errorf(n, path, nil, "name %q may only have %s", s, chars)
		return "", false
	case len(s) > maxNameLen:
		p.errorf(n, path, nil, "name is longer than %d characters", maxNameLen)
		return "", false
	}
	if prev, ok := seen[s]; ok {
		p.errorf(n, path, nil, "name %q is already used at line %d", s, prev.Line)
		return "", false
	}
	if s == reservedClientName && re == clientNameRE {
		p.errorf(n, path, nil, "name %q is the key of clients that no source names; choose another", s)
		return "", false
	}
	seen[s] = n
	return s, true
}

func (p *parser) policies(n *yaml.Node, c *Config) {
	seen := map[string]*yaml.Node{}
	p.listItems(n, "policies", func(i int, item *yaml.Node, m *mapping) {
		path := p.itemPath("policies", i, m)
		p.checkKnown(m, path, policyFields...)
		pol := &Policy{Line: item.Line}
		name, nameOK := p.name(m, path, policyNameRE, "a-z, 0-9, '.', '_' and '-'", seen)
		pol.Name = name
		good := true // the fields that make the policy; the name is not one of them
		algN, limitN, periodN, burstN := p.get(m, "algorithm"), p.get(m, "limit"), p.get(m, "period"), p.get(m, "burst")
		if algN == nil {
			p.errorf(m.node, path, nil, "algorithm is required (fixed-window, sliding-log, sliding-window, token-bucket or leaky-bucket)")
			good = false
		} else if s, ok := p.str(algN, path, "algorithm"); ok {
			a, err := sluice.ParseAlgorithm(s)
			if err != nil {
				p.errorf(algN, path, nil, "algorithm %q is unknown (want fixed-window, sliding-log, sliding-window, token-bucket or leaky-bucket)", s)
				good = false
			}
			pol.Algorithm = a
		} else {
			good = false
		}
		at := map[string]*yaml.Node{"algorithm": algN, "limit": limitN, "period": periodN, "burst": burstN}
		// Validate stops at a policy's first problem; each field's own bounds are checked alone
		// first, so that a bad limit and a bad period are both reported, each at its line. A
		// probe is a valid policy with that one field replaced.
		probe := func(field string, set func(*sluice.Policy)) {
			pr := sluice.Policy{Name: "probe", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}
			set(&pr)
			if err := pr.Validate(); err != nil {
				p.policyError(err, pr.Name, path, m.node, map[string]*yaml.Node{field: at[field]})
				good = false
			}
		}
		if limitN == nil {
			p.errorf(m.node, path, nil, "limit is required: the requests (cost units) allowed per period")
			good = false
		} else if v, ok := p.int(limitN, path, "limit"); ok {
			pol.Limit = v
			probe("limit", func(pr *sluice.Policy) { pr.Limit = v })
		} else {
			good = false
		}
		if periodN == nil {
			p.errorf(m.node, path, nil, "period is required (e.g. 1s, 1m, 24h)")
			good = false
		} else if d, ok := p.duration(periodN, path, "period"); ok {
			pol.Period = d
			probe("period", func(pr *sluice.Policy) { pr.Period = d })
		} else {
			good = false
		}
		if burstN != nil {
			if v, ok := p.int(burstN, path, "burst"); ok {
				pol.Burst = v
				// A token bucket takes any burst in range; its limit and period keep the
				// refill-time bound out of the way.
				probe("burst", func(pr *sluice.Policy) {
					pr.Algorithm, pr.Limit, pr.Period, pr.Burst = sluice.TokenBucket, algorithm.MaxLimit, time.Millisecond, v
				})
			} else {
				good = false
			}
		}
		if n := p.get(m, "dry_run"); n != nil {
			pol.DryRun, _ = p.bool(n, path, "dry_run")
		}
		if good { // every field good on its own (the name aside): what is left is how they combine
			whole := pol.Policy
			whole.Name = "probe" // the name is checked above; it is only cut out of the message
			if err := whole.Validate(); err != nil {
				p.policyError(err, whole.Name, path, m.node, at)
			}
		}
		if nameOK {
			c.policies[name] = pol // even if invalid: references to it are not the problem
			c.Policies = append(c.Policies, pol)
		}
	})
}

// policyError reports a Validate error of the policy called name at the field it names
// ("burst -5 must be ≥ 0").
func (p *parser) policyError(err error, name string, path string, item *yaml.Node, at map[string]*yaml.Node) {
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, fmt.Sprintf("policy %q: ", name)); ok {
		msg = rest
	}
	where := item
	field, _, _ := strings.Cut(msg, " ")
	if n := at[strings.Trim(field, "(")]; n != nil {
		where = n
	}
	p.errorf(where, path, err, "%s", msg)
}

func (p *parser) clients(n *yaml.Node, c *Config, r *refs) {
	seen := map[string]*yaml.Node{}
	keys := map[[sha256.Size]byte]*yaml.Node{}
	subjects := map[string]*yaml.Node{}
	c.byName, c.byKey, c.bySubject = map[string]*Client{}, map[[sha256.Size]byte]*Client{}, map[string]*Client{}
	p.listItems(n, "clients", func(i int, item *yaml.Node, m *mapping) {
		path := p.itemPath("clients", i, m)
		p.checkKnown(m, path, clientFields...)
		cl := &Client{Line: item.Line, index: len(c.Clients)}
		name, ok := p.name(m, path, clientNameRE, "A-Z, a-z, 0-9, '.', '_' and '-'", seen)
		cl.Name = name
		hashN, subjN := p.get(m, "api_key_sha256"), p.get(m, "jwt_subject")
		if hashN != nil {
			var hashes []*yaml.Node
			switch hashN.Kind {
			case yaml.SequenceNode:
				if len(hashN.Content) == 0 {
					p.errorf(hashN, path, nil, "api_key_sha256 is an empty list")
				}
				for i, h := range hashN.Content {
					if h = p.deref(h); h == nil {
						p.errorf(hashN.Content[i], path, nil, "api_key_sha256[%d] is empty", i)
					} else {
						hashes = append(hashes, h)
					}
				}
			default:
				hashes = []*yaml.Node{hashN}
			}
			for _, h := range hashes {
				s, ok := p.str(h, path, "api_key_sha256")
				if !ok {
					continue
				}
				var sum [sha256.Size]byte
				if len(s) != 2*sha256.Size {
					p.errorf(h, path, nil, "api_key_sha256 %q must be 64 hex digits (the SHA-256 of the key: printf %%s KEY | sha256sum), not %d characters", s, len(s))
					continue
				}
				if _, err := hex.Decode(sum[:], []byte(s)); err != nil {
					p.errorf(h, path, nil, "api_key_sha256 %q must be 64 hex digits (0-9, a-f)", s)
					continue
				}
				if prev, ok := keys[sum]; ok {
					p.errorf(h, path, nil, "api_key_sha256 %s… is already a key at line %d; a key names one client", strings.ToLower(s[:8]), prev.Line)
					continue
				}
				keys[sum] = h
				cl.APIKeySHA256 = append(cl.APIKeySHA256, strings.ToLower(s))
				c.byKey[sum] = cl
			}
		}
		if subjN != nil {
			if s, ok := p.str(subjN, path, "jwt_subject"); ok {
				if prev, ok := subjects[s]; ok {
					p.errorf(subjN, path, nil, "jwt_subject %q is already a client's at line %d", s, prev.Line)
				} else if s == "" {
					p.errorf(subjN, path, nil, "jwt_subject is empty")
				} else {
					subjects[s] = subjN
					cl.JWTSubject = s
					c.bySubject[s] = cl
				}
			}
		}
		if hashN == nil && subjN == nil {
			p.errorf(m.node, path, nil, "api_key_sha256 or jwt_subject is required: how else would the client be known?")
		}
		if hashN != nil && !p.identityBad && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.APIKey != nil }) {
			p.errorf(hashN, path, nil, "api_key_sha256 is never matched: identity has no api_key source")
		}
		if subjN != nil && !p.identityBad && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.JWT != nil }) {
			p.errorf(subjN, path, nil, "jwt_subject is never matched: identity has no jwt source")
		}
		if n := p.get(m, "policy"); n != nil {
			r.lists = append(r.lists, refList{path, "policy", p.names(n, path, "policy"), &cl.Policy})
		}
		if ok {
			c.byName[name] = cl
			c.Clients = append(c.Clients, cl)
		}
	})
}

func (p *parser) routes(n *yaml.Node, c *Config, r *refs) {
	seen := map[string]*yaml.Node{}
	p.listItems(n, "routes", func(i int, item *yaml.Node, m *mapping) {
		path := fmt.Sprintf("routes[%d]", i)
		if n := p.get(m, "path_prefix"); n != nil && n.Kind == yaml.ScalarNode && len(n.Value) <= 60 {
			what := n.Value
			if mn := p.get(m, "method"); mn != nil && mn.Kind == yaml.ScalarNode && len(mn.Value) <= 20 && mn.Value != "" {
				what = strings.ToUpper(mn.Value) + " " + what
			}
			path += " " + strconv.Quote(what)
		}
		p.checkKnown(m, path, routeFields...)
		rt := &Route{Line: item.Line, Cost: DefaultCost}
		if n := p.get(m, "method"); n != nil {
			if s, ok := p.str(n, path, "method"); ok {
				if s != "" && !headerNameRE.MatchString(s) {
					p.errorf(n, path, nil, "method %q is not an HTTP method", s)
				}
				rt.Method = strings.ToUpper(s)
			}
		}
		prefixN := p.get(m, "path_prefix")
		if prefixN == nil {
			p.errorf(m.node, path, nil, "path_prefix is required (e.g. path_prefix: /reports; / matches every path)")
		} else if s, ok := p.str(prefixN, path, "path_prefix"); ok {
			if !strings.HasPrefix(s, "/") {
				p.errorf(prefixN, path, nil, "path_prefix %q must start with /", s)
			} else {
				rt.PathPrefix = s
				key := rt.Method + " " + s
				if prev, ok := seen[key]; ok {
					p.errorf(prefixN, path, nil, "%s is already a route at line %d", strings.TrimSpace(key), prev.Line)
				}
				seen[key] = prefixN
			}
		}
		r.route[rt] = path
		if n := p.get(m, "cost"); n != nil {
			r.cost[rt] = n
			if v, ok := p.int(n, path, "cost"); ok {
				if v < 0 {
					p.errorf(n, path, nil, "cost %d must be ≥ 0", v)
				} else {
					rt.Cost = v
				}
			}
		}
		if n := p.get(m, "policy"); n != nil {
			r.lists = append(r.lists, refList{path, "policy", p.names(n, path, "policy"), &rt.Policy})
		}
		if n := p.get(m, "scope"); n != nil {
			if s, ok := p.str(n, path, "scope"); ok {
				if !policyNameRE.MatchString(s) || len(s) > maxNameLen {
					p.errorf(n, path, nil, "scope %q may only have a-z, 0-9, '.', '_' and '-' (at most %d)", s, maxNameLen)
				} else {
					rt.Scope = s
					r.scope[rt] = n
				}
			}
		}
		c.Routes = append(c.Routes, rt)
	})
}

func (p *parser) limits(n *yaml.Node, l *Limits) {
	const path = "limits"
	m := p.mapping(n, n, "", "limits")
	if m == nil {
		return
	}
	p.checkKnown(m, path, limitsFields...)
	if n := p.get(m, "max_delay"); n != nil {
		if d, ok := p.duration(n, path, "max_delay"); ok {
			if d < 0 {
				p.errorf(n, path, nil, "max_delay %v must be ≥ 0", d)
			} else {
				l.MaxDelay = d
			}
		}
	}
	if n := p.get(m, "legacy_headers"); n != nil {
		l.LegacyHeaders, _ = p.bool(n, path, "legacy_headers")
	}
}

func (p *parser) server(n *yaml.Node, s *Server) {
	const path = "server"
	m := p.mapping(n, n, "", "server")
	if m == nil {
		return
	}
	p.checkKnown(m, path, serverFields...)
	if n := p.get(m, "body_timeout"); n != nil {
		if d, ok := p.duration(n, path, "body_timeout"); ok {
			if d <= 0 {
				p.errorf(n, path, nil, "body_timeout %v must be > 0", d)
			} else {
				s.BodyTimeout = d
			}
		}
	}
	if n := p.get(m, "body_min_rate"); n != nil {
		if v, ok := p.int(n, path, "body_min_rate"); ok {
			if v < 0 || v > 1<<40 {
				p.errorf(n, path, nil, "body_min_rate %d must be from 0 (no rate: the whole body within body_timeout) to 2^40 bytes per second", v)
			} else {
				s.BodyMinRate = v
			}
		}
	}
	if n := p.get(m, "drain_timeout"); n != nil {
		if d, ok := p.duration(n, path, "drain_timeout"); ok {
			if d < 0 {
				p.errorf(n, path, nil, "drain_timeout %v must be ≥ 0", d)
			} else {
				s.DrainTimeout = d
			}
		}
	}
}

// references checks every policy name the file refers to, and the routes' scopes.
func (p *parser) references(c *Config, r *refs) {
	for _, l := range r.lists {
		var names []string
		for i, rf := range l.list {
			f := l.field
			if len(l.list) > 1 {
				f = fmt.Sprintf("%s[%d]", l.field, i)
			}
			switch {
			case c.policies[rf.name] == nil:
				p.errorf(rf.node, l.path, nil, "%s %q is not defined in policies (%s)", f, rf.name, p.known(c))
			case slices.Contains(names, rf.name):
				p.errorf(rf.node, l.path, nil, "%s %q is listed twice", f, rf.name)
			default:
				names = append(names, rf.name)
			}
		}
		*l.dst = names
	}
	scopes := map[string]*Route{}
	for _, rt := range c.Routes {
		if rt.Scope == "" {
			continue
		}
		at, path := r.scope[rt], r.route[rt]
		if _, ok := c.policies[rt.Scope]; ok {
			p.errorf(at, path, nil, "scope %q is also a policy's name; pick another, so that their counters stay apart", rt.Scope)
		}
		if prev, ok := scopes[rt.Scope]; ok && !slices.Equal(prev.Policy, rt.Policy) {
			p.errorf(at, path, nil, "scope %q is also the scope of the route at line %d, with other policies; routes that share a scope must share their policy", rt.Scope, prev.Line)
		} else if !ok {
			scopes[rt.Scope] = rt
		}
	}
}

// known lists the policy names for "is not a policy" errors.
func (p *parser) known(c *Config) string {
	if len(c.Policies) == 0 {
		return "no policies are configured"
	}
	names := make([]string, 0, len(c.Policies))
	for _, pol := range c.Policies {
		names = append(names, pol.Name)
	}
	if len(names) > 10 {
		names = append(names[:10], "...")
	}
	return "known: " + strings.Join(names, ", ")
}

// resolveAll builds the lookups and every resolution, once the file is known to be valid, and
// checks that every route's cost can fit the policies that apply on it.
func (p *parser) resolveAll(c *Config, r *refs) {
	c.defaults = c.resolution(c.DefaultPolicy, "")
	for _, cl := range c.Clients {
		if len(cl.Policy) > 0 {
			cl.resolution = c.resolution(cl.Policy, "")
		} else {
			cl.resolution = c.defaults
		}
	}
	for _, rt := range c.Routes {
		if len(rt.Policy) > 0 {
			res := c.resolution(rt.Policy, rt.Scope)
			rt.own = &res
		} else if rt.Scope != "" {
			rt.scoped = make([]resolution, len(c.Clients)+1)
			for j, cl := range c.Clients {
				rt.scoped[j] = c.resolution(cl.resolutionNames(c), rt.Scope)
			}
			rt.scoped[len(c.Clients)] = c.resolution(c.DefaultPolicy, rt.Scope)
		}
		// A cost that no state could ever approve is a configuration error, not a 429 forever.
		checked := map[string]bool{}
		checkAll := func(res *resolution) {
			for _, a := range res.applied {
				if checked[a.PolicyName] {
					continue
				}
				checked[a.PolicyName] = true
				var d sluice.Decision
				pol := c.policies[a.PolicyName].Policy
				if err := algorithm.CheckCost(&pol, rt.Cost, &d); err != nil {
					at := r.cost[rt]
					if at == nil {
						at = &yaml.Node{Line: rt.Line}
					}
					msg := strings.TrimPrefix(err.Error(), sluice.ErrCostExceedsLimit.Error()+": ")
					p.errorf(at, r.route[rt], err, "%s", msg)
				}
			}
		}
		switch {
		case rt.own != nil:
			checkAll(rt.own)
		case rt.scoped != nil:
			for j := range rt.scoped {
				checkAll(&rt.scoped[j])
			}
		default:
			checkAll(&c.defaults)
			for _, cl := range c.Clients {
				checkAll(&cl.resolution)
			}
		}
	}
	c.matchList = slices.Clone(c.Routes)
	slices.SortStableFunc(c.matchList, func(a, b *Route) int {
		if d := len(b.PathPrefix) - len(a.PathPrefix); d != 0 {
			return d
		}
		switch {
		case a.Method != "" && b.Method == "":
			return -1
		case a.Method == "" && b.Method != "":
			return 1
		}
		return 0
	})
}

// resolutionNames is the names of the client's policies: its own, or the default.
func (cl *Client) resolutionNames(c *Config) []string {
	if len(cl.Policy) > 0 {
		return cl.Policy
	}
	return c.DefaultPolicy
}

// resolution resolves names (all known) under scope.
func (c *Config) resolution(names []string, scope string) resolution {
	res := resolution{policies: make([]sluice.Policy, 0, len(names)), applied: make([]AppliedPolicy, 0, len(names))}
	for _, name := range names {
		pol := c.policies[name]
		sp := pol.Policy
		switch {
		case scope == "":
		case len(names) == 1:
			sp.Name = scope
		default:
			sp.Name = scope + "/" + name
		}
		res.policies = append(res.policies, sp)
		res.applied = append(res.applied, AppliedPolicy{Policy: sp, PolicyName: name, DryRun: pol.DryRun})
	}
	return res
}

// rls reads the rls section: Envoy's rate limit service (gRPC) and its envoyproxy/ratelimit
// configuration files (read by package rls/envoyconf, not here: config only names them).
func (p *parser) rls(n *yaml.Node) *RLS {
	const path = "rls"
	m := p.mapping(n, n, "", "rls")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, rlsFields...)
	r := &RLS{Listen: DefaultRLSListen, Line: n.Line}
	if n := p.get(m, "listen"); n != nil {
		if s, ok := p.hostPort(n, path, "listen"); ok {
			r.Listen = s
		}
	}
	n = p.get(m, "envoy_config")
	if n == nil {
		p.errorf(m.node, path, nil, "envoy_config is required: the envoyproxy/ratelimit configuration files, e.g. envoy_config: [ratelimit.yaml]")
		return r
	}
	items, ok := p.seq(n, path, "envoy_config")
	if !ok {
		return r
	}
	if len(items) == 0 {
		p.errorf(n, path, nil, "envoy_config must name at least one file")
	}
	for i, it := range items {
		field := fmt.Sprintf("envoy_config[%d]", i)
		name, ok := p.str(it, path, field)
		if !ok {
			continue
		}
		if name == "" {
			p.errorf(it, path, nil, "%s must be a file name", field)
			continue
		}
		r.EnvoyConfig = append(r.EnvoyConfig, p.path(name))
		r.EnvoyLines = append(r.EnvoyLines, it.Line)
	}
	return r
}

// forwardAuth reads the forward_auth section: how /v1/forward-auth answers a refused request.
func (p *parser) forwardAuth(n *yaml.Node, f *ForwardAuth) {
	const path = "forward_auth"
	m := p.mapping(n, n, "", "forward_auth")
	if m == nil {
		return
	}
	p.checkKnown(m, path, faFields...)
	if n := p.get(m, "refused_status"); n != nil {
		if v, ok := p.int(n, path, "refused_status"); ok {
			if v < 400 || v > 599 {
				p.errorf(n, path, nil, "refused_status %d must be a 4xx or 5xx status (nginx's auth_request passes only 401 and 403 on; 429 suits Caddy and Traefik)", v)
			} else {
				f.RefusedStatus = int(v)
			}
		}
	}
}
