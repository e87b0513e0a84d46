// This file reads the store section: its type, Redis addresses, URL or sentinels, credentials,
// replica acknowledgements and failure mode, and the secrets named by an environment variable
// (env).

package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

func (p *parser) store(n *yaml.Node, s *Store) { p.storeAt(n, "", "store", s) }

// storeAt reads a store mapping at parent.field: the top-level store, or region.global (a
// region's ledger, config/region.go).
func (p *parser) storeAt(n *yaml.Node, parent, field string, s *Store) {
	path := field
	if parent != "" {
		path = parent + "." + field
	}
	m := p.mapping(n, n, parent, field)
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
		s.Addrs = p.hostPorts(n, path, "addrs", "127.0.0.1:6379")
	}
	urlN := p.get(m, "url")
	if urlN != nil {
		if raw, ok := p.secretStr(urlN, path, "url"); ok {
			s.URL = p.redisURL(urlN, path, raw)
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
	if n := p.get(m, "slow_timeout"); n != nil {
		if d, ok := p.duration(n, path, "slow_timeout"); ok {
			if d < s.Timeout {
				p.errorf(n, path, nil, "slow_timeout %v must be ≥ timeout (%v): a call waits timeout for a Redis that answers nothing, up to slow_timeout for one that answers others", d, s.Timeout)
			} else {
				s.SlowTimeout = d
			}
		}
	} else {
		s.SlowTimeout = max(s.SlowTimeout, s.Timeout)
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
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
			if n.Value == "fleet" {
				s.LocalShare = LocalShareFleet
			} else {
				p.errorf(n, path, nil, "local_share %q must be fleet (1/n, n the instances on the Redis) or a number in (0, 1]", n.Value)
			}
		} else if v, ok := p.float(n, path, "local_share"); ok {
			if !(v > 0 && v <= 1) {
				p.errorf(n, path, nil, "local_share %s must be in (0, 1]: this instance's share of each policy while Redis is down", n.Value)
			} else {
				s.LocalShare = v
			}
		}
	}
	if n := p.get(m, "fleet"); n != nil {
		if v, ok := p.plainName(n, path, "fleet"); ok {
			s.Fleet = v
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
	if n := p.get(m, "refusal_cache"); n != nil {
		if v, ok := p.int(n, path, "refusal_cache"); ok {
			if v < 0 || v > 1<<24 {
				p.errorf(n, path, nil, "refusal_cache %d must be from 0 (off) to 2^24 refusals", v)
			} else {
				s.RefusalCache = int(v)
			}
		}
	}
	sentN := p.get(m, "sentinel")
	if sentN != nil {
		s.Sentinel = p.sentinel(sentN, path)
	}
	if n := p.get(m, "replicas_ack"); n != nil {
		if v, ok := p.int(n, path, "replicas_ack"); ok {
			if v < 0 || v > maxReplicasAck {
				p.errorf(n, path, nil, "replicas_ack %d must be from 0 (off) to %d replicas", v, maxReplicasAck)
			} else {
				s.ReplicasAck = int(v)
			}
		}
	}
	if n := p.get(m, "replicas_ack_timeout"); n != nil {
		if d, ok := p.duration(n, path, "replicas_ack_timeout"); ok {
			switch {
			case d <= 0:
				p.errorf(n, path, nil, "replicas_ack_timeout %v must be > 0", d)
			case d%time.Millisecond != 0:
				p.errorf(n, path, nil, "replicas_ack_timeout %v must be a whole number of milliseconds (WAIT takes milliseconds)", d)
			default:
				s.ReplicasAckTimeout = d
			}
		}
	}
	if n := p.get(m, "settle_retry_for"); n != nil {
		if d, ok := p.duration(n, path, "settle_retry_for"); ok {
			if d < time.Second || d > 24*time.Hour {
				p.errorf(n, path, nil, "settle_retry_for %v must be from 1s to 24h: how long a settlement the store could not confirm is retried", d)
			} else {
				s.SettleRetryFor = d
			}
		}
	}
	if s.Type == StoreRedis {
		switch {
		case len(s.Addrs) == 0 && s.URL == "" && !m.has("addrs") && urlN == nil && !m.has("sentinel"):
			p.errorf(m.node, path, nil, "the redis store needs addrs (e.g. addrs: [127.0.0.1:6379]), url or sentinel")
		case m.has("addrs") && urlN != nil:
			p.errorf(urlN, path, nil, "url and addrs are both set; give one")
		case m.has("sentinel") && (m.has("addrs") || urlN != nil):
			p.errorf(m.values["sentinel"], path, nil, "sentinel and %s are both set; give one (with sentinel, the sentinels name the primary)",
				map[bool]string{true: "addrs", false: "url"}[m.has("addrs")])
		}
	}
}

// plainName reads a name of A-Z, a-z, 0-9, '.', '_' and '-', 1 to maxNameLen of them (a fleet's,
// a region's).
func (p *parser) plainName(n *yaml.Node, path, field string) (string, bool) {
	v, ok := p.str(n, path, field)
	switch {
	case !ok:
	case !clientNameRE.MatchString(v):
		p.errorf(n, path, nil, "%s %q may only have A-Z, a-z, 0-9, '.', '_' and '-' (and not be empty)", field, v)
	case len(v) > maxNameLen:
		p.errorf(n, path, nil, "%s is longer than %d characters", field, maxNameLen)
	default:
		return v, true
	}
	return "", false
}

// maxReplicasAck bounds store.replicas_ack (as the Redis store does).
const maxReplicasAck = 1000

// hostPorts reads a non-empty list of host:port (field of path); example is one, for errors.
func (p *parser) hostPorts(n *yaml.Node, path, field, example string) []string {
	items, ok := p.seq(n, path, field)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errorf(n, path, nil, "%s is an empty list", field)
	}
	var out []string
	for i, item := range items {
		field := fmt.Sprintf("%s[%d]", field, i)
		if item = p.deref(item); item == nil {
			p.errorf(items[i], path, nil, "%s is empty", field)
			continue
		}
		if a, ok := p.str(item, path, field); ok {
			if host, port, err := net.SplitHostPort(a); err != nil || host == "" {
				p.errorf(item, path, nil, "%s %q is not host:port (e.g. %s)", field, a, example)
			} else if v, err := strconv.ParseUint(port, 10, 16); err != nil || v == 0 {
				p.errorf(item, path, nil, "%s %q: port %q must be a number from 1 to 65535", field, a, port)
			} else {
				out = append(out, a)
			}
		}
	}
	return out
}

// sentinel reads store.sentinel: the master name, the sentinels' addresses, and the sentinels'
// own credentials (the primary's are the store's username and password).
func (p *parser) sentinel(n *yaml.Node, parent string) *Sentinel {
	path := parent + ".sentinel"
	m := p.mapping(n, n, parent, "sentinel")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, sentinelKeys...)
	sn := &Sentinel{}
	if n := p.get(m, "master"); n != nil {
		if v, ok := p.str(n, path, "master"); ok {
			if v == "" {
				p.errorf(n, path, nil, "master is empty (the name the sentinels monitor the primary by: sentinel monitor NAME ...)")
			}
			sn.Master = v
		}
	} else {
		p.errorf(m.node, path, nil, "sentinel needs master: the name the sentinels monitor the primary by (sentinel monitor NAME ...)")
	}
	if n := p.get(m, "addrs"); n != nil {
		sn.Addrs = p.hostPorts(n, path, "addrs", "127.0.0.1:26379")
	} else {
		p.errorf(m.node, path, nil, "sentinel needs addrs: the sentinels' host:port (e.g. addrs: [127.0.0.1:26379])")
	}
	if n := p.get(m, "username"); n != nil {
		sn.Username, _ = p.str(n, path, "username")
	}
	pwN, envN := p.get(m, "password"), p.get(m, "password_env")
	if pwN != nil && envN != nil {
		p.errorf(envN, path, nil, "password_env and password are both set; keep one (password_env keeps the password out of the file)")
	} else if pwN != nil {
		if pw, ok := p.secretStr(pwN, path, "password"); ok {
			sn.Password = NewSecret(pw)
		}
	} else if envN != nil {
		sn.PasswordEnv, sn.Password = p.env(envN, path, "password_env", "sentinel password")
	}
	return sn
}

// redisURL checks a redis:// or rediss:// URL. It never echoes the URL, which may hold a user.
func (p *parser) redisURL(n *yaml.Node, path, raw string) string {
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
