// This file reads the sections about where sluice listens and answers: listen and admin_listen,
// upstream, tls, limits, server, rls and forward_auth.

package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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

func (p *parser) tls(n *yaml.Node, path string, fields []string) *TLS {
	m := p.mapping(n, n, "", path)
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, fields...)
	var t TLS
	certN, keyN := p.get(m, "cert_file"), p.get(m, "key_file")
	if certN != nil {
		t.CertFile, _ = p.str(certN, path, "cert_file")
	}
	if keyN != nil {
		t.KeyFile, _ = p.str(keyN, path, "key_file")
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		if certN == nil && keyN == nil && p.get(m, "client_ca_file") == nil {
			return nil
		}
		p.errorf(m.node, path, nil, "cert_file and key_file are required (or leave tls out)")
		return nil
	case t.KeyFile == "":
		p.errorf(m.node, path, nil, "key_file is required with cert_file")
		return nil
	case t.CertFile == "":
		p.errorf(m.node, path, nil, "cert_file is required with key_file")
		return nil
	}
	t.CertFile, t.KeyFile = p.path(t.CertFile), p.path(t.KeyFile)
	cert, err := readFile(t.CertFile)
	if err != nil {
		p.errorf(certN, path, err, "cert_file %q cannot be read: %v", t.CertFile, err)
	}
	key, kerr := readFile(t.KeyFile)
	if kerr != nil {
		p.errorf(keyN, path, kerr, "key_file %q cannot be read: %v", t.KeyFile, kerr)
	}
	if err != nil || kerr != nil {
		return nil
	}
	// Parsed and dropped: the private key stays out of the Config (and so out of any printout).
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		p.errorf(certN, path, err, "cert_file and key_file are not a PEM certificate and its private key: %v", err)
		return nil
	}
	if caN := p.get(m, "client_ca_file"); caN != nil { // only where fields allow it: checkKnown said so
		if f, ok := p.str(caN, path, "client_ca_file"); ok {
			t.ClientCAFile = p.path(f)
			pem, err := readFile(t.ClientCAFile)
			if err != nil {
				p.errorf(caN, path, err, "client_ca_file %q cannot be read: %v", t.ClientCAFile, err)
				return nil
			}
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				p.errorf(caN, path, nil, "client_ca_file %q holds no PEM certificate", t.ClientCAFile)
				return nil
			}
		}
	}
	return &t
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
	if n := p.get(m, "body_memory"); n != nil {
		if v, ok := p.int(n, path, "body_memory"); ok {
			if v < 1<<20 || v > 1<<40 {
				p.errorf(n, path, nil, "body_memory %d must be from 1048576 (1 MiB) to 2^40 bytes (of usage routes' request bodies held in memory at once)", v)
			} else {
				s.BodyMemory = v
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
	if n := p.get(m, "shutdown_delay"); n != nil {
		if d, ok := p.duration(n, path, "shutdown_delay"); ok {
			if d < 0 {
				p.errorf(n, path, nil, "shutdown_delay %v must be ≥ 0", d)
			} else {
				s.ShutdownDelay = d
			}
		}
	}
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
	if n := p.get(m, "tls"); n != nil {
		r.TLS = p.tls(n, path+".tls", adminTLSFields)
	}
	if qn := p.get(m, "quota"); qn != nil {
		r.Quota = p.quota(qn)
	}
	if xn := p.get(m, "xds"); xn != nil {
		r.XDS = p.xds(xn)
		if m.has("envoy_config") {
			p.errorf(m.values["envoy_config"], path, nil, "envoy_config and xds are both set: the rules come from files or from a management server, not both (leave one out)")
		}
		return r
	}
	n = p.get(m, "envoy_config")
	if n == nil && r.Quota != nil {
		return r // the quota service alone: no per-request rules
	}
	if n == nil {
		p.errorf(m.node, path, nil, "envoy_config, xds or quota is required: the envoyproxy/ratelimit configuration files, e.g. envoy_config: [ratelimit.yaml], an xDS management server, e.g. xds: {server: envoy-gateway:18001, node_id: envoy-ratelimit}, or the quota service's buckets (quota: {buckets: [...]})")
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

// xds reads rls.xds: the management server the rules come from.
func (p *parser) xds(n *yaml.Node) *XDS {
	const path = "rls.xds"
	m := p.mapping(n, n, "", path)
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, xdsFields...)
	x := &XDS{RetryInitial: DefaultXDSRetryInitial, RetryMax: DefaultXDSRetryMax, Line: n.Line}
	if sn := p.get(m, "server"); sn == nil {
		p.errorf(m.node, path, nil, "server is required: the management server's host:port, e.g. envoy-gateway:18001")
	} else if s, ok := p.str(sn, path, "server"); ok {
		host, port, err := net.SplitHostPort(s)
		if v, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil || v == 0 {
			p.errorf(sn, path, nil, "server %q is not host:port with a host and a port from 1 to 65535 (e.g. envoy-gateway:18001)", s)
		} else {
			x.Server = s
		}
	}
	if nn := p.get(m, "node_id"); nn == nil {
		p.errorf(m.node, path, nil, "node_id is required: the node the server keeps the rules for (Envoy Gateway's: envoy-ratelimit)")
	} else if s, ok := p.str(nn, path, "node_id"); ok {
		if s == "" {
			p.errorf(nn, path, nil, "node_id must not be empty")
		}
		x.NodeID = s
	}
	if mn := p.get(m, "node_metadata"); mn != nil {
		mm := p.mapping(mn, mn, path, "node_metadata")
		if mm != nil {
			x.NodeMetadata = map[string]string{}
			for _, k := range mm.keys {
				vn := p.get(mm, k.Value)
				if vn == nil {
					p.errorf(k, path, nil, "node_metadata.%s has no value", k.Value)
					continue
				}
				if v, ok := p.str(vn, path, "node_metadata."+k.Value); ok {
					x.NodeMetadata[k.Value] = v
				}
			}
		}
	}
	if tn := p.get(m, "tls"); tn != nil {
		x.TLS = p.xdsTLS(tn)
	}
	if rn := p.get(m, "connect_retry"); rn != nil {
		const rpath = path + ".connect_retry"
		rm := p.mapping(rn, rn, path, "connect_retry")
		p.checkKnown(rm, rpath, retryFields...)
		for _, f := range []struct {
			name string
			dst  *time.Duration
		}{{"initial", &x.RetryInitial}, {"max", &x.RetryMax}} {
			if fn := p.get(rm, f.name); fn != nil {
				if d, ok := p.duration(fn, rpath, f.name); ok && d <= 0 {
					p.errorf(fn, rpath, nil, "%s %s must be greater than 0", f.name, d)
				} else if ok {
					*f.dst = d
				}
			}
		}
		if x.RetryMax < x.RetryInitial {
			p.errorf(rn, rpath, nil, "max %s is less than initial %s", x.RetryMax, x.RetryInitial)
		}
	}
	return x
}

// xdsTLS reads rls.xds.tls and checks its files: the CA holds a certificate, the client
// certificate and key are a pair (the key is parsed and dropped).
func (p *parser) xdsTLS(n *yaml.Node) *XDSTLS {
	const path = "rls.xds.tls"
	m := p.mapping(n, n, "", path)
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, xdsTLSFields...)
	t := &XDSTLS{}
	nodes := map[string]*yaml.Node{}
	for _, f := range []struct {
		name string
		dst  *string
		file bool
	}{{"ca_file", &t.CA, true}, {"cert_file", &t.Cert, true}, {"key_file", &t.Key, true}, {"server_name", &t.ServerName, false}} {
		fn := p.get(m, f.name)
		if fn == nil {
			continue
		}
		nodes[f.name] = fn
		if s, ok := p.str(fn, path, f.name); ok {
			if s == "" {
				p.errorf(fn, path, nil, "%s must not be empty (or leave it out)", f.name)
			} else if f.file {
				*f.dst = p.path(s)
			} else {
				*f.dst = s
			}
		}
	}
	if t.CA != "" {
		if pem, err := readFile(t.CA); err != nil {
			p.errorf(nodes["ca_file"], path, err, "ca_file %q cannot be read: %v", t.CA, err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			p.errorf(nodes["ca_file"], path, nil, "ca_file %q holds no PEM certificate", t.CA)
		}
	}
	switch {
	case t.Cert != "" && t.Key == "":
		p.errorf(m.node, path, nil, "key_file is required with cert_file")
	case t.Key != "" && t.Cert == "":
		p.errorf(m.node, path, nil, "cert_file is required with key_file")
	case t.Cert != "":
		cert, err := readFile(t.Cert)
		if err != nil {
			p.errorf(nodes["cert_file"], path, err, "cert_file %q cannot be read: %v", t.Cert, err)
		}
		key, kerr := readFile(t.Key)
		if kerr != nil {
			p.errorf(nodes["key_file"], path, kerr, "key_file %q cannot be read: %v", t.Key, kerr)
		}
		if err == nil && kerr == nil {
			if _, err := tls.X509KeyPair(cert, key); err != nil {
				p.errorf(nodes["cert_file"], path, err, "cert_file and key_file are not a PEM certificate and its private key: %v", err)
			}
		}
	}
	return t
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

// log reads the log section: the format of sluice's log lines and the least level written.
func (p *parser) log(n *yaml.Node, l *Log) {
	const path = "log"
	m := p.mapping(n, n, "", "log")
	if m == nil {
		return
	}
	p.checkKnown(m, path, logFields...)
	if n := p.get(m, "format"); n != nil {
		if v, ok := p.str(n, path, "format"); ok {
			switch v {
			case LogText, LogJSON:
				l.Format = v
			default:
				p.errorf(n, path, nil, "format %q must be text or json", v)
			}
		}
	}
	if n := p.get(m, "access"); n != nil {
		l.Access = p.accessLog(n)
	}
	if n := p.get(m, "level"); n != nil {
		if v, ok := p.str(n, path, "level"); ok {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(v)); err != nil || strings.ContainsAny(v, "+-") {
				p.errorf(n, path, nil, "level %q must be debug, info, warn or error", v)
			} else {
				l.Level = lv
			}
		}
	}
}

// accessLog reads log.access: true, or a mapping of its bounds.
func (p *parser) accessLog(n *yaml.Node) *AccessLog {
	const path = "log.access"
	a := &AccessLog{Sample: 1}
	if d := p.deref(n); d != nil && d.Kind == yaml.ScalarNode {
		on, ok := p.bool(n, "log", "access")
		if !ok || !on {
			return nil
		}
		return a
	}
	m := p.mapping(n, n, "log", "access")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, accessFields...)
	if n := p.get(m, "sample"); n != nil {
		if v, ok := p.float(n, path, "sample"); ok {
			if !(v > 0 && v <= 1) {
				p.errorf(n, path, nil, "sample %v must be in (0, 1]: the share of requests logged", v)
			} else {
				a.Sample = v
			}
		}
	}
	if n := p.get(m, "per_second"); n != nil {
		if v, ok := p.float(n, path, "per_second"); ok {
			if !(v >= 0 && v <= 1e6) {
				p.errorf(n, path, nil, "per_second %v must be from 0 (no bound) to 1,000,000 lines a second", v)
			} else {
				a.PerSecond = v
			}
		}
	}
	return a
}

// admin reads the admin section: who may use the admin listener, and a listener of its own for
// /metrics.
func (p *parser) admin(n *yaml.Node, a *Admin) {
	const path = "admin"
	m := p.mapping(n, n, "", "admin")
	if m == nil {
		return
	}
	p.checkKnown(m, path, adminFields...)
	if n := p.get(m, "token_env"); n != nil {
		a.TokenEnv, a.Token = p.env(n, path, "token_env", "admin token")
	}
	if n := p.get(m, "metrics_listen"); n != nil {
		if s, ok := p.hostPort(n, path, "metrics_listen"); ok {
			a.MetricsListen = s
		}
	}
	if n := p.get(m, "tls"); n != nil {
		a.TLS = p.tls(n, path+".tls", adminTLSFields)
	}
	if n := p.get(m, "tokens"); n != nil {
		seen := map[string]*yaml.Node{}
		p.listItems(n, "admin.tokens", func(i int, item *yaml.Node, tm *mapping) {
			tpath := fmt.Sprintf("admin.tokens[%d]", i)
			p.checkKnown(tm, tpath, tokenFields...)
			var t NamedToken
			if nn := p.get(tm, "name"); nn == nil {
				p.errorf(item, tpath, nil, "name is required: it says who wrote in the clients API's audit trail")
			} else if s, ok := p.str(nn, tpath, "name"); ok {
				switch {
				case !clientNameRE.MatchString(s) || len(s) > 64:
					p.errorf(nn, tpath, nil, "name %q must be 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'", s)
				case s == AdminTokenName:
					p.errorf(nn, tpath, nil, "name %q is admin.token_env's; give this token another", s)
				case seen[s] != nil:
					p.errorf(nn, tpath, nil, "name %q is already a token's at line %d", s, seen[s].Line)
				default:
					seen[s], t.Name = nn, s
				}
			}
			if en := p.get(tm, "token_env"); en == nil {
				p.errorf(item, tpath, nil, "token_env is required: the environment variable that holds the token")
			} else {
				t.TokenEnv, t.Token = p.env(en, tpath, "token_env", "admin token")
			}
			a.Tokens = append(a.Tokens, t)
		})
	}
	if n := p.get(m, "clients_file"); n != nil {
		if s, ok := p.str(n, path, "clients_file"); ok {
			if s == "" {
				p.errorf(n, path, nil, "clients_file is empty; leave it out to keep the clients API's records in memory only")
			}
			a.ClientsFile = p.path(s)
		}
	}
	a.ClientsPoll = DefaultClientsPoll
	if n := p.get(m, "clients_poll"); n != nil {
		if d, ok := p.duration(n, path, "clients_poll"); ok {
			if d < 10*time.Millisecond || d > 10*time.Second {
				p.errorf(n, path, nil, "clients_poll %v must be from 10ms to 10s: how often each instance looks for changes of the clients API's records", d)
			} else {
				a.ClientsPoll = d
			}
		}
	}
}

// tracing reads the tracing section: OpenTelemetry spans exported over OTLP/gRPC or OTLP/HTTP.
func (p *parser) tracing(n *yaml.Node) *Tracing {
	const path = "tracing"
	m := p.mapping(n, n, "", "tracing")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, tracingFields...)
	t := &Tracing{Protocol: OTLPGRPC, Sample: 1, ServiceName: "sluice"}
	if n := p.get(m, "otlp_protocol"); n != nil {
		if v, ok := p.str(n, path, "otlp_protocol"); ok {
			switch v {
			case OTLPGRPC, OTLPHTTP:
				t.Protocol = v
			default:
				p.errorf(n, path, nil, "otlp_protocol %q must be %s (OTLP/gRPC, port 4317) or %s (OTLP/HTTP, port 4318)", v, OTLPGRPC, OTLPHTTP)
			}
		}
	}
	if n := p.get(m, "otlp_endpoint"); n != nil {
		if s, ok := p.hostPort(n, path, "otlp_endpoint"); ok {
			t.Endpoint = s
		}
	} else {
		p.errorf(m.node, path, nil, "otlp_endpoint is required: the OTLP collector's host:port, e.g. otlp_endpoint: 127.0.0.1:4317 (gRPC) or 127.0.0.1:4318 (otlp_protocol: http/protobuf)")
	}
	if n := p.get(m, "sample"); n != nil {
		if v, ok := p.float(n, path, "sample"); ok {
			if !(v >= 0 && v <= 1) {
				p.errorf(n, path, nil, "sample %v must be from 0 to 1: the share of new traces recorded", v)
			} else {
				t.Sample = v
			}
		}
	}
	if n := p.get(m, "service_name"); n != nil {
		if v, ok := p.str(n, path, "service_name"); ok && v != "" {
			t.ServiceName = v
		}
	}
	return t
}

// bodyMemoryFits checks that server.body_memory holds the largest body every usage route reads
// (its max_body): a body larger than the whole budget could never be read.
func (p *parser) bodyMemoryFits(m *mapping, c *Config) {
	for _, rt := range c.Routes {
		if rt.Usage == nil || rt.Usage.MaxBody <= c.Server.BodyMemory {
			continue
		}
		at := m.node
		if sn := m.values["server"]; sn != nil {
			at = sn
			if sm := p.mapping(sn, sn, "", "server"); sm != nil && sm.values["body_memory"] != nil {
				at = sm.values["body_memory"]
			}
		}
		p.errorf(at, "server", nil, "body_memory %d is less than the usage.max_body %d of the route at line %d: such a body could never be read; raise body_memory or lower max_body",
			c.Server.BodyMemory, rt.Usage.MaxBody, rt.Line)
		return
	}
}
