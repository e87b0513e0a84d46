// This file holds the parse's entry (Parse's parse, the YAML document), the field names of
// every section, and the top-level walk (config) that hands each section to its reader.

package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
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

// The field names of every mapping come from the schema below (config/jsonschema.go): the
// checkKnown calls take them from there, so that a field the parser reads but the schema lacks is
// an unknown field, and the JSON Schema (JSONSchema) cannot drift from the parser.
var (
	topFields          = configSchema.names()
	tlsFields          = tlsSchema.names()
	adminTLSFields     = adminTLSSchema.names()
	storeFields        = storeSchema.names()
	sentinelKeys       = sentinelSchema.names() // store.sentinel's fields
	identityKinds      = identitySchema.names()
	apiKeyFields       = apiKeySchema.names()
	jwtFields          = jwtSchema.names()
	ipFields           = ipSchema.names()
	policyFields       = policySchema.names()
	budgetFields       = budgetSchema.names()
	keyByFields        = keyBySchema.names() // a key_by element written as a mapping
	orgFields          = orgSchema.names()
	groupFields        = teamSchema.names()
	clientFields       = clientSchema.names()
	routeFields        = routeSchema.names()
	costFromFields     = costFromSchema.names()
	countOnlyFields    = countOnlySchema.names()
	usageFields        = usageSchema.names()
	weightsFields      = weightsSchema.names()
	estimateFields     = estimateSchema.names()
	modelFields        = modelSchema.names()
	priceFields        = priceSchema.names()
	limitsFields       = limitsSchema.names()
	serverFields       = serverSchema.names()
	rlsFields          = rlsSchema.names()
	xdsFields          = xdsSchema.names()
	xdsTLSFields       = xdsTLSSchema.names()
	retryFields        = retrySchema.names()
	quotaFields        = quotaSchema.names()
	quotaBucketFields  = quotaBucketSchema.names()
	regionFields       = regionSchema.names()
	faFields           = forwardAuthSchema.names()
	logFields          = logSchema.names()
	accessFields       = accessSchema.names()
	adminFields        = adminSchema.names()
	tokenFields        = tokenSchema.names()
	tracingFields      = tracingSchema.names()
	loadSheddingFields = loadSheddingSchema.names()
	// redisOnly are the store fields the memory store refuses.
	redisOnly = []string{"addrs", "url", "username", "password", "password_env", "prefix", "timeout", "slow_timeout", "on_error", "local_share", "fleet", "sentinel", "replicas_ack", "replicas_ack_timeout"}
)

var (
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

// config walks the document's root.
func (p *parser) config(root *yaml.Node) *Config {
	c := &Config{
		File: p.file, Listen: DefaultListen, AdminListen: DefaultAdminListen,
		Store: Store{Type: StoreMemory, Prefix: DefaultStorePrefix, Timeout: DefaultStoreTimeout, SlowTimeout: DefaultSlowTimeout, LocalShare: DefaultLocalShare,
			Fleet: DefaultFleet, RefusalCache: DefaultRefusalCache},
		Limits:      Limits{MaxDelay: DefaultMaxDelay},
		Server:      Server{BodyTimeout: DefaultBodyTimeout, BodyMinRate: DefaultBodyMinRate, BodyMemory: DefaultBodyMemory, DrainTimeout: DefaultDrainTimeout},
		ForwardAuth: ForwardAuth{RefusedStatus: DefaultRefusedStatus},
		Log:         Log{Format: LogText, Level: slog.LevelInfo},
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
		c.TLS = p.tls(n, "tls", tlsFields)
	}
	if n := p.get(m, "store"); n != nil {
		p.store(n, &c.Store)
	}
	if n := p.get(m, "region"); n != nil {
		c.Region = p.region(n, c) // (config/region.go)
	}
	c.Identity = p.identity(m)

	r := refs{scope: map[*Route]*yaml.Node{}, cost: map[*Route]*yaml.Node{}, route: map[*Route]string{}, prio: map[*Route]*yaml.Node{}}
	c.policies = map[string]*Policy{}
	if n := p.get(m, "policies"); n != nil {
		p.policies(n, c)
	}
	if n := p.get(m, "default_policy"); n != nil {
		r.lists = append(r.lists, refList{"", "default_policy", p.names(n, "", "default_policy"), &c.DefaultPolicy})
	}
	p.groups(m, c, &r) // organisations and teams (config/levels.go)
	if n := p.get(m, "clients"); n != nil {
		p.clients(n, c, &r)
	}
	if n := p.get(m, "routes"); n != nil {
		p.routes(n, c, &r)
	}
	if n := p.get(m, "models"); n != nil {
		p.models(n, c, &r) // (config/usage.go)
	}
	if n := p.get(m, "load_shedding"); n != nil {
		c.LoadShedding = p.loadShedding(n, c) // (config/shed.go)
	}
	p.routePriorities(c, &r)
	if n := p.get(m, "limits"); n != nil {
		p.limits(n, &c.Limits)
	}
	if n := p.get(m, "server"); n != nil {
		p.server(n, &c.Server)
	}
	p.bodyMemoryFits(m, c)
	if n := p.get(m, "rls"); n != nil {
		c.RLS = p.rls(n)
	}
	if n := p.get(m, "log"); n != nil {
		p.log(n, &c.Log)
	}
	if n := p.get(m, "tracing"); n != nil {
		c.Tracing = p.tracing(n)
	}
	if n := p.get(m, "admin"); n != nil {
		p.admin(n, &c.Admin)
		if l := c.Admin.MetricsListen; l != "" && (l == c.Listen || l == c.AdminListen || (c.RLS != nil && l == c.RLS.Listen)) {
			p.errorf(m.values["admin"], "admin", nil, "metrics_listen %q is also another listener's; give it a port of its own", l)
		}
		if c.Admin.ClientsFile != "" && c.Store.Type == StoreRedis {
			am := p.mapping(n, n, "", "admin")
			p.errorf(p.get(am, "clients_file"), "admin", nil, "clients_file is for the memory store: with a Redis store the clients API's records are kept in Redis, shared by every instance")
		}
	} else {
		c.Admin.ClientsPoll = DefaultClientsPoll
	}
	if n := p.get(m, "forward_auth"); n != nil {
		p.forwardAuth(n, &c.ForwardAuth)
		p.afterNotForwardAuth(c, n, &r)
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
