// Package config reads sluice's configuration: one YAML file that says where the gateway listens,
// where it forwards, where the limiter keeps its state, how it tells clients apart, and which
// policies apply to whom (see docs/config.md for every field).
//
//	cfg, err := config.Load("sluice.yaml")
//	// err lists every problem, one a line, each with file, line and column:
//	// sluice.yaml:14:30: policies[2] "gold": burst -5 must be ≥ 0
//
// Parsing is strict: unknown fields, values of the wrong type, names that refer to nothing and
// files that cannot be read are errors, all of them reported at once, sorted by line. Secrets are
// read from the environment at load and never printed (see Secret). A Config is immutable once
// loaded and safe for concurrent use; a reload builds a new one.
package config

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/shed"
)

// Defaults of the fields that have one.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultAdminListen   = "127.0.0.1:9090"
	DefaultStoreTimeout  = 50 * time.Millisecond  // the Redis store's own default (checked by cmd/sluice's tests)
	DefaultSlowTimeout   = 500 * time.Millisecond // likewise
	DefaultStorePrefix   = "rate-limit:"          // likewise
	DefaultMaxKeys       = 1 << 20                // the memory store's own default (likewise)
	DefaultRefusalCache  = 1 << 16                // the Redis store's cache of refusals: its own default (likewise)
	DefaultLocalShare    = LocalShareFleet        // on_error local: 1/n of each policy, n the instances on the Redis
	DefaultFleet         = "default"              // the instance registry's fleet: its keys are those of before fleets had names
	DefaultAPIKeyHeader  = "X-API-Key"
	DefaultJWTHeader     = "Authorization" // the token may follow "Bearer "
	DefaultJWTClaim      = "sub"
	DefaultIPv4Prefix    = 32
	DefaultIPv6Prefix    = 64
	DefaultCost          = 1
	DefaultMaxDelay      = 10 * time.Second
	DefaultBodyTimeout   = 10 * time.Second
	DefaultBodyMinRate   = 1024     // bytes per second
	DefaultBodyMemory    = 64 << 20 // bytes of usage routes' request bodies held at once
	DefaultDrainTimeout  = 30 * time.Second
	DefaultRLSListen     = "127.0.0.1:8081"
	DefaultRefusedStatus = 429
)

// Store types.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// Config is one loaded configuration. Its exported fields are the file's, with defaults applied
// and values parsed; its methods answer the gateway's questions without allocating. Treat it as
// read-only: the lookups share its slices.
type Config struct {
	File        string   // the file's name as given to Load or Parse ("demo" for Demo)
	Listen      string   // the proxy's host:port
	AdminListen string   // the admin listener's host:port; "" (written admin_listen: "") turns it off
	Upstream    *url.URL // where allowed requests go: http or https, scheme://host[:port][/path]
	TLS         *TLS     // the proxy listener's certificate; nil: plain HTTP
	Store       Store
	Region      *Region    // nil: no region section, no global policies (config/region.go)
	Identity    []Identity // in order: the first source that names the client wins
	Policies    []*Policy  // in file order
	// DefaultPolicy names the policies of requests that no client and no route policy covers
	// (anonymous, limited per IP); empty: those requests are not limited.
	DefaultPolicy []string
	Clients       []*Client // in file order
	Routes        []*Route  // in file order (Route matches in its own order)
	Limits        Limits
	Server        Server
	RLS           *RLS // Envoy's rate limit service; nil: not served
	ForwardAuth   ForwardAuth
	Log           Log
	Admin         Admin
	Tracing       *Tracing      // nil: no traces
	LoadShedding  *LoadShedding // nil: no throttling by load (config/shed.go)
	// Models are the models' prices and policies, for usage routes (config/usage.go).
	Models []*Model

	// Organisations and Teams group clients above themselves: a request of a client is charged
	// at every level it belongs to (config/levels.go). In file order.
	Organisations []*Group
	Teams         []*Group
	orgs, teams   map[string]*Group // by name

	policies  map[string]*Policy
	models    map[string]*Model // Models by name
	byName    map[string]*Client
	byKey     map[[sha256.Size]byte]*Client
	bySubject map[string]*Client
	matchList []*Route   // Routes, longest path_prefix first, then method-specific before any
	defaults  resolution // DefaultPolicy resolved
	// budgets is the local_budget of each route scope's state name (their policy's).
	budgets map[string]sluice.LocalBudget
}

// TLS is a listener's certificate and key (PEM files), checked at load: the proxy's (tls), the
// admin listener's (admin.tls) or the rate limit service's (rls.tls).
type TLS struct {
	CertFile string // resolved against the configuration's directory
	KeyFile  string
	// ClientCAFile (admin.tls and rls.tls only), if set, holds the CAs whose client certificates
	// the listener accepts: on the admin listener every request but the probes and
	// /v1/forward-auth must present one; on rls every connection must (mTLS).
	ClientCAFile string
}

// LocalShareFleet is local_share: fleet: the share is 1/n, n the live instances on the Redis
// (they register there with a heartbeat), as last seen before Redis went down.
const LocalShareFleet = 0

// Store says where the limiter keeps its state.
type Store struct {
	Type        string        // StoreMemory (the default) or StoreRedis
	Addrs       []string      // redis: host:port; one is a single server, several are nodes of one Cluster, from which the client discovers the rest
	URL         string        // redis, instead of Addrs: redis://[user@]host:port[/db], rediss:// for TLS
	Username    string        // redis ACL user
	Password    Secret        // redis password, from password or from the environment (password_env)
	PasswordEnv string        // the environment variable Password was read from, if any
	Prefix      string        // redis key prefix; default DefaultStorePrefix
	Timeout     time.Duration // redis: how long a decision waits once Redis is found down, and settlements always; default DefaultStoreTimeout
	// SlowTimeout (redis) bounds every decision while Redis is not known to be down, and is how
	// long Redis must answer nothing at all before a call that timed out counts as Redis down
	// (against the breaker); ≥ Timeout. Default DefaultSlowTimeout (raised to Timeout if below).
	SlowTimeout time.Duration
	OnError     sluice.FailureMode // what happens when Redis cannot decide; default FailClosed
	LocalShare  float64            // with OnError FailLocal: this instance's share of each policy, in (0, 1], or LocalShareFleet
	Fleet       string             // redis: the instances that count each other in the registry (the fallback's share, the diagnosis); default DefaultFleet
	MaxKeys     int                // keys held by the memory store (or the local fallback); 0: DefaultMaxKeys
	// RefusalCache bounds the refusals the Redis store remembers, to answer a client retrying
	// before its Retry-After without a round trip; 0 turns the cache off. Default
	// DefaultRefusalCache.
	RefusalCache int
	// Sentinel, for redis instead of Addrs and URL: the primary is the one these sentinels name,
	// followed through failovers.
	Sentinel *Sentinel
	// ReplicasAck: replicas that must acknowledge (WAIT) each decision that consumed before it is
	// answered allowed; 0 (the default) is off.
	ReplicasAck int
	// ReplicasAckTimeout bounds that WAIT; 0 means Timeout.
	ReplicasAckTimeout time.Duration
	// SettleRetryFor: how long after its first attempt a settlement the store could not confirm
	// is retried (sluice.SettlementOptions.RetryFor); 0 means sluice.DefaultSettleRetryFor.
	SettleRetryFor time.Duration
}

// Sentinel is store.sentinel: the master name the sentinels monitor, their addresses, and their
// own credentials, if they require any (the primary's are the store's Username and Password).
type Sentinel struct {
	Master      string
	Addrs       []string
	Username    string
	Password    Secret
	PasswordEnv string // the environment variable Password was read from, if any
}

// Identity is one source of the client's identity. Exactly one of its pointers is set.
type Identity struct {
	APIKey *APIKeySource
	JWT    *JWTSource
	IP     *IPSource
	Line   int // where the source is written
}

// Kind is "api_key", "jwt" or "ip".
func (id *Identity) Kind() string {
	switch {
	case id.APIKey != nil:
		return "api_key"
	case id.JWT != nil:
		return "jwt"
	case id.IP != nil:
		return "ip"
	}
	return ""
}

// APIKeySource names the client by an API key in a header, matched against the clients'
// api_key_sha256 (Config.ClientByAPIKey).
type APIKeySource struct {
	Header string // default DefaultAPIKeyHeader
}

// JWTSource names the client by a claim of a JSON Web Token whose signature, exp and nbf verify
// (jwt.Source, package identity/jwt, takes these fields).
type JWTSource struct {
	Header        string           // default DefaultJWTHeader; a "Bearer " before the token is stripped
	Algorithms    []string         // accepted "alg" values (never empty): HS256/384/512, RS256/384/512, PS256/384/512, ES256/384/512, EdDSA
	SecretEnv     string           // the environment variable the HMAC secret was read from
	Secret        Secret           // the HMAC secret (HS algorithms), read at load; at least as long as the hash
	PublicKeyFile string           // the PEM public key (RS, PS, ES, EdDSA), resolved against the configuration's directory
	PublicKey     crypto.PublicKey // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey, parsed at load
	Claim         string           // the claim whose value names the client (Client.JWTSubject); default "sub"
	Issuer        string           // if set, the "iss" claim must equal it
	Audience      string           // if set, the "aud" claim must contain it
	Leeway        time.Duration    // clock skew allowed on exp and nbf; default 0
}

// IPSource names an anonymous client by its address: the peer's, or the rightmost untrusted one
// in the forwarding header the proxies write when the peer is a trusted proxy
// (identity.IP takes these fields).
type IPSource struct {
	TrustedProxies  []netip.Prefix // masked; single addresses are /32 or /128, IPv4-mapped CIDRs are IPv4
	IPv4Prefix      int            // IPv4 clients are grouped by this prefix; default 32 (each address alone)
	IPv6Prefix      int            // IPv6 clients are grouped by this prefix; default 64 (one per subnet)
	ForwardedHeader string         // "X-Forwarded-For" or "Forwarded": the only header believed, the one the proxies write; "" X-Forwarded-For
}

// Policy is one configured policy.
type Policy struct {
	sluice.Policy      // valid (Policy.Validate), and accepted by the Redis store when that is the store
	DryRun        bool // decide and count, add the headers, but never refuse
	// LocalBudget (local_budget) lets each instance take Size units of the policy at once from a
	// shared store and spend them in process (sluice.LocalBudget); Size 0: every request is
	// decided by the store.
	LocalBudget sluice.LocalBudget
	// KeyBy is what the policy counts by (key_by), in order: nil, the default, counts per client
	// (its key, Identity.Key); not nil, one counter per distinct tuple of these attributes of the
	// request, empty being one counter for every request (see KeyPart).
	KeyBy []KeyPart
	// Counts is what the policy counts (counts): requests, a usage route's tokens, or their
	// price in micro-dollars; UnitDefault: tokens on a usage route, requests elsewhere.
	Counts Unit
	// Global (global: true): one limit for all regions; this region enforces its allotment of
	// it from the ledger (config/region.go).
	Global bool
	Line   int
}

// Client is one configured client: who it is and its contract.
type Client struct {
	Name         string   // [A-Za-z0-9._-]+, unique, not "anonymous"; names the client in keys, metrics and 429 bodies
	APIKeySHA256 []string // lower-case hex SHA-256 of its API keys (several while rotating)
	JWTSubject   string   // the value of the jwt source's claim that names this client
	Policy       []string // its policies; empty: DefaultPolicy
	Line         int

	// Set for clients managed at runtime (config/runtime.go); the file's have none of these.
	Source    string              // SourceFile ("") or SourceAPI
	Plan      string              // the plan its policies and overrides came from, if any (informative)
	Overrides map[string]Override // by policy name: the limit, burst or period this client has instead of the policy's

	index      int        // in Config.Clients
	resolution resolution // Policy (or DefaultPolicy) resolved

	// Team and Organisation name the groups whose policies charge the client's requests too
	// (config/levels.go); "" none. A client in a team is in the team's organisation.
	Team         string
	Organisation string
	levels       [2][]AppliedPolicy // its groups' policies: [0] on other routes, [1] on usage routes
}

// Group is an organisation or a team: a name its policies count under for all its clients
// (config/levels.go).
type Group struct {
	Name         string   // [A-Za-z0-9._-]+, unique among its kind
	Organisation string   // a team's organisation; "" none (and always, for an organisation)
	Policy       []string // its policies
	Line         int
}

// Route gives requests by method and path prefix a cost, and optionally their own policies or
// their own counters (scope).
type Route struct {
	Method     string   // upper-case; "" matches any method
	PathPrefix string   // matches every path that starts with it, byte for byte
	Cost       int64    // units each request takes; default 1; 0 checks without consuming
	Policy     []string // if set, replaces the client's policies on this route
	Scope      string   // if set, the route's requests count under this name instead of the policy's
	After      *After   // if set, the cost is settled once the upstream's response is known (after.go)
	// Usage, if set, makes the route's cost its tokens: an estimate read from the request's body,
	// settled to the usage its response reports (config/usage.go).
	Usage *Usage
	// Priority, if set, is load shedding's priority of every request on this route, whoever sends
	// it, over its client's (config/shed.go); it needs load_shedding.
	Priority *shed.Priority
	Line     int

	own    *resolution  // Policy resolved, scope applied; nil if Policy is empty
	scoped []resolution // Scope without Policy: per client index, the default last
}

// Limits are the gateway's answers.
type Limits struct {
	MaxDelay      time.Duration // the longest a leaky-bucket policy may hold a request; default 10s
	LegacyHeaders bool          // also send X-RateLimit-Limit, -Remaining, -Reset
}

// Server is how the proxy listener treats slow clients, and how long a shutdown waits.
//
// A request body gets BodyTimeout from the end of its header, and every byte that arrives adds
// 1/BodyMinRate of a second to that, never to more than BodyTimeout from now: a body may pause for
// at most BodyTimeout, and one that comes slower than BodyMinRate falls behind by BodyTimeout in
// the end and is cut (408, or the connection closed if part of it was forwarded). BodyMinRate 0:
// the whole body must arrive within BodyTimeout.
type Server struct {
	BodyTimeout time.Duration // > 0; default DefaultBodyTimeout
	BodyMinRate int64         // bytes per second, ≥ 0; default DefaultBodyMinRate
	// BodyMemory is the most bytes of usage routes' request bodies the proxy holds in memory at
	// once (each is read whole for its estimate); default DefaultBodyMemory. At least every usage
	// route's max_body.
	BodyMemory   int64
	DrainTimeout time.Duration // ≥ 0: on SIGTERM, how long requests in flight may take to finish; default DefaultDrainTimeout
	// ShutdownDelay ≥ 0: on SIGTERM, how long sluice goes on serving, /readyz answering 503,
	// before it stops listening and drains: the time a load balancer takes to stop sending it
	// requests. 0 (the default): none.
	ShutdownDelay time.Duration
}

// RLS is Envoy's rate limit service (envoy.service.ratelimit.v3 over gRPC): where it listens and
// where its rules come from (domains, descriptors, limits): envoyproxy/ratelimit configuration
// files, or an xDS management server; one or the other.
type RLS struct {
	Listen      string   // host:port; default DefaultRLSListen
	EnvoyConfig []string // the files, resolved against the configuration's directory; none with XDS
	EnvoyLines  []int    // the line each file is named on
	XDS         *XDS     // nil: the rules are the files
	TLS         *TLS     // nil: plaintext gRPC; with ClientCAFile, every client must present a certificate of those CAs
	Quota       *Quota   // the Rate Limit Quota Service (StreamRateLimitQuotas); nil: not served
	Line        int
}

// XDS is the management server the rate limit service subscribes to for its rules (RateLimitConfig
// resources over state-of-the-world ADS), as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW.
type XDS struct {
	Server       string            // host:port
	NodeID       string            // the node the server keeps the rules for
	NodeMetadata map[string]string // may be nil
	TLS          *XDSTLS           // nil: plaintext
	// The wait before connecting again: RetryInitial, doubling up to RetryMax (jittered).
	RetryInitial, RetryMax time.Duration
	Line                   int
}

// XDSTLS is TLS to the management server; its files are resolved against the configuration's
// directory and checked at load.
type XDSTLS struct {
	CA         string // the CA the server's certificate is checked against; "": the system's
	Cert, Key  string // the client certificate and its key; both or neither
	ServerName string // the name to check the server's certificate for; "": the server's host
}

// Defaults of rls.xds.
const (
	DefaultXDSRetryInitial = time.Second
	DefaultXDSRetryMax     = 30 * time.Second
)

// Tracing exports OpenTelemetry traces: a span per proxied request (the decision, the status),
// a child span per store call, and the W3C traceparent passed on to the upstream.
type Tracing struct {
	Endpoint    string  // the OTLP collector, host:port (plaintext)
	Protocol    string  // OTLPGRPC (default) or OTLPHTTP
	Sample      float64 // the share of traces begun here that are recorded, 0..1; default 1. A request's own traceparent decides for it
	ServiceName string  // service.name; default "sluice"
}

// The OTLP transports of Tracing.Protocol, named as OTEL_EXPORTER_OTLP_PROTOCOL names them.
const (
	OTLPGRPC = "grpc"          // OTLP/gRPC, the collector's port 4317
	OTLPHTTP = "http/protobuf" // OTLP/HTTP: protobuf POSTed to /v1/traces, the collector's port 4318
)

// Admin protects the admin listener.
type Admin struct {
	// Token, if set, is the bearer token every admin request but /healthz, /readyz and
	// /v1/forward-auth (which trusts only trusted_proxies) must carry: Authorization: Bearer TOKEN.
	Token    Secret
	TokenEnv string // the environment variable it was read from
	// Tokens are more bearer tokens, each with a name, that the admin listener takes as it takes
	// Token: the clients API's audit trail says who wrote by the token's name (Token's is
	// AdminTokenName).
	Tokens []NamedToken
	// MetricsListen, if set, is a listener of its own serving only /metrics (and /healthz),
	// without the token, for scrapers that should reach nothing else.
	MetricsListen string
	// TLS, if set, serves the admin listener over HTTPS; with TLS.ClientCAFile, it also wants a
	// client certificate (as the token, both when both are set). Changes at a restart.
	TLS *TLS
	// ClientsFile (memory store only) is where the clients API's records are kept across
	// restarts (a journal: package clients); "": in memory only, gone at a restart. With a Redis
	// store they are kept in Redis. Changes at a restart.
	ClientsFile string
	// ClientsPoll is how often each instance looks for changes of the clients API's records
	// (one GET of the registry's version); default DefaultClientsPoll.
	ClientsPoll time.Duration
}

// NamedToken is one of admin.tokens.
type NamedToken struct {
	Name     string
	Token    Secret
	TokenEnv string
}

// AdminTokenName is the name admin.token_env's token writes under in the audit trail.
const AdminTokenName = "admin"

// AdminTokenFor returns the name of the admin token that token is (compared in constant time),
// or "" if it is none of them.
func (a *Admin) AdminTokenFor(token string) string {
	name := ""
	if !a.Token.IsZero() && subtle.ConstantTimeCompare([]byte(token), []byte(a.Token.Value())) == 1 {
		name = AdminTokenName
	}
	for _, t := range a.Tokens {
		if subtle.ConstantTimeCompare([]byte(token), []byte(t.Token.Value())) == 1 && name == "" {
			name = t.Name
		}
	}
	return name
}

// HasToken reports whether the admin listener takes tokens (admin.token_env or admin.tokens).
func (a *Admin) HasToken() bool { return !a.Token.IsZero() || len(a.Tokens) > 0 }

// DefaultClientsPoll is admin.clients_poll's default.
const DefaultClientsPoll = 100 * time.Millisecond

// Log formats.
const (
	LogText = "text" // slog's key=value lines
	LogJSON = "json" // one JSON object a line
)

// Log is how sluice writes its log (to standard error): the format, and the least level
// written. A reload changes the level; the format changes at a restart.
type Log struct {
	Format string     // LogText (the default) or LogJSON
	Level  slog.Level // default slog.LevelInfo
	// Access, if set, writes a line per request the proxy served (at level info): who, what,
	// the decision, the status and the times; never a credential.
	Access *AccessLog
}

// AccessLog bounds the access log.
type AccessLog struct {
	Sample    float64 // the share of requests logged, in (0, 1]; default 1
	PerSecond float64 // at most this many lines a second (the rest are counted, not written); 0: no bound
}

// ForwardAuth is how /v1/forward-auth (proxies' auth sub-requests) answers.
type ForwardAuth struct {
	// RefusedStatus is the status of a refused request's answer; default 429. nginx's
	// auth_request passes only 401 and 403 on (anything else is its error 500).
	RefusedStatus int
}

// AppliedPolicy is a policy as it applies to a request.
type AppliedPolicy struct {
	// Policy is what to decide with. Its Name is the name the state is kept under (the second
	// half of the key "partner-a:orders-api"): the policy's own name, or, on a route with a scope,
	// the scope ("scope/policy" when several policies apply there).
	Policy     sluice.Policy
	PolicyName string // the configured policy's name: for answers and metrics
	Key        string // the key it counts under; "" the client's
	DryRun     bool   // decide and count, but never refuse
	// KeyBy is the policy's key_by (nil: counted per client, Key ""): the decision layer fills
	// Key from the request's attributes when it is not nil.
	KeyBy []KeyPart
	// Unit is what the policy counts here: requests, or on a usage route tokens or
	// micro-dollars (never UnitDefault).
	Unit Unit

	// Level is whom the limit counts for when that is not the client itself, as answers name it
	// (team "ml", organisation "acme"); "" the client (config/levels.go). Key is then the
	// group's.
	Level string
	// Global: the policy is global: true, and Policy.Limit is replaced at decision time by the
	// region's allotment (decision.Global).
	Global bool
}

// resolution is a list of policies resolved for one case, in both shapes the gateway asks for.
type resolution struct {
	policies []sluice.Policy
	applied  []AppliedPolicy
}

// Secret holds a password or key that never prints itself: fmt's verbs (%v, %+v, %#v, %s, %q,
// %x) and text encodings (JSON, YAML) give "[redacted]", or "" when it is empty. It holds a
// pointer so that even fmt's fallback printing (a wrong verb on an enclosing struct, which skips
// Format) shows an address, never the secret. Value returns it. The zero Secret is empty.
type Secret struct {
	p *string // nil when empty
}

// NewSecret returns a Secret holding s.
func NewSecret(s string) Secret {
	if s == "" {
		return Secret{}
	}
	return Secret{&s}
}

const redacted = "[redacted]"

// Value returns the secret itself.
func (s Secret) Value() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.p == nil }

func (s Secret) String() string {
	if s.p == nil {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// Format implements fmt.Formatter, so that no verb prints the secret.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, s.GoString())
		return
	}
	fmt.Fprint(f, s.String())
}

// MarshalText implements encoding.TextMarshaler (JSON, YAML) without the secret.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Load reads and parses the configuration file at path. See Parse.
func Load(path string) (*Config, error) {
	data, err := readFileMax(path, maxConfigSize)
	if err != nil {
		return nil, Errors{{File: path, Msg: "cannot read the configuration: " + err.Error(), Err: err}}
	}
	return Parse(data, path)
}

// Parse parses a configuration. name is the file's name: errors carry it, and the files the
// configuration names (tls, public_key_file) are relative to its directory. Environment
// variables named by password_env and secret_env are read now.
//
// The error, if any, is Errors: every problem found, sorted by line.
func Parse(data []byte, name string) (*Config, error) {
	return parse(data, name, os.LookupEnv)
}

// Policy returns the configured policy called name.
func (c *Config) Policy(name string) (sluice.Policy, bool) {
	p, ok := c.policies[name]
	if !ok {
		return sluice.Policy{}, false
	}
	return p.Policy, true
}

// Applied returns the configured policy called name as it applies outside any route and scope
// (the decision API asks by policy name), or a model's own policy by its name there, "policy@model".
func (c *Config) Applied(name string) (AppliedPolicy, bool) {
	p, ok := c.policies[name]
	if !ok {
		return c.modelApplied(name) // a model's own, "policy@model" (config/usage.go)
	}
	return AppliedPolicy{Policy: p.Policy, PolicyName: p.Name, DryRun: p.DryRun, KeyBy: p.KeyBy, Global: p.Global}, true
}

// LocalBudget returns the local_budget of the policy whose state is kept under name (the
// Policy.Name a store sees: a policy's own name, or a route's scope); Size 0 if it has none.
func (c *Config) LocalBudget(name string) sluice.LocalBudget {
	if p, ok := c.policies[name]; ok {
		return p.LocalBudget
	}
	return c.budgets[name]
}

// ClientByName returns the client called name.
func (c *Config) ClientByName(name string) (*Client, bool) {
	cl, ok := c.byName[name]
	return cl, ok
}

// ClientByKeyHash returns the client whose api_key_sha256 is hexSum (either case).
func (c *Config) ClientByKeyHash(hexSum string) (*Client, bool) {
	var sum [sha256.Size]byte
	if len(hexSum) != 2*sha256.Size {
		return nil, false
	}
	if _, err := hex.Decode(sum[:], []byte(hexSum)); err != nil {
		return nil, false
	}
	return c.ClientByKeySum(sum)
}

// ClientByKeySum returns the client whose api_key_sha256 is sum.
func (c *Config) ClientByKeySum(sum [sha256.Size]byte) (*Client, bool) {
	cl, ok := c.byKey[sum]
	return cl, ok
}

// ClientByAPIKey returns the client whose API key is key (it hashes key; the key is kept nowhere).
func (c *Config) ClientByAPIKey(key string) (*Client, bool) {
	return c.ClientByKeySum(sha256.Sum256([]byte(key)))
}

// ClientBySubject returns the client whose jwt_subject is subject.
func (c *Config) ClientBySubject(subject string) (*Client, bool) {
	cl, ok := c.bySubject[subject]
	return cl, ok
}

// TeamByName returns the team called name.
func (c *Config) TeamByName(name string) (*Group, bool) {
	g, ok := c.teams[name]
	return g, ok
}

// OrganisationByName returns the organisation called name.
func (c *Config) OrganisationByName(name string) (*Group, bool) {
	g, ok := c.orgs[name]
	return g, ok
}

// Route returns the route of a request: among the routes whose path_prefix starts path, the
// longest; of equally long ones, the one for method before the one for any method.
func (c *Config) Route(method, path string) (*Route, bool) {
	for _, r := range c.matchList {
		if strings.HasPrefix(path, r.PathPrefix) && (r.Method == "" || r.Method == method) {
			return r, true
		}
	}
	return nil, false
}

// PoliciesFor returns the policies that apply to a request of client (nil: no configured client)
// on route (nil: no route): the route's policies if it has any, else the client's, else
// DefaultPolicy; empty if none applies. On a route with a scope, the policies' Names are the
// scope (see AppliedPolicy). The slice is shared: do not modify it.
func (c *Config) PoliciesFor(client *Client, route *Route) []sluice.Policy {
	return c.resolve(client, route).policies
}

// AppliedPoliciesFor is PoliciesFor with each policy's configured name and dry-run flag.
func (c *Config) AppliedPoliciesFor(client *Client, route *Route) []AppliedPolicy {
	return c.resolve(client, route).applied
}

func (c *Config) resolve(client *Client, route *Route) *resolution {
	if route != nil {
		if route.own != nil {
			return route.own
		}
		if route.scoped != nil {
			if client != nil {
				return &route.scoped[client.index]
			}
			return &route.scoped[len(route.scoped)-1]
		}
	}
	if client != nil {
		return &client.resolution
	}
	return &c.defaults
}

// String summarizes the configuration in one line, for logs. It prints no secret.
func (c *Config) String() string {
	var b strings.Builder
	if c.Listen == "" {
		fmt.Fprintf(&b, "config %q: no proxy listener", c.File)
	} else {
		fmt.Fprintf(&b, "config %q: listen %s", c.File, c.Listen)
	}
	if c.TLS != nil {
		b.WriteString(" (TLS)")
	}
	if c.AdminListen != "" {
		fmt.Fprintf(&b, ", admin %s", c.AdminListen)
	}
	if c.Upstream != nil {
		fmt.Fprintf(&b, ", upstream %s", c.Upstream.Redacted())
	}
	if c.RLS != nil {
		if x := c.RLS.XDS; x != nil {
			fmt.Fprintf(&b, ", rls %s (xds %s as %q)", c.RLS.Listen, x.Server, x.NodeID)
		} else if len(c.RLS.EnvoyConfig) > 0 || c.RLS.Quota == nil {
			fmt.Fprintf(&b, ", rls %s (%d envoy_config files)", c.RLS.Listen, len(c.RLS.EnvoyConfig))
		} else {
			fmt.Fprintf(&b, ", rls %s", c.RLS.Listen)
		}
		if q := c.RLS.Quota; q != nil {
			fmt.Fprintf(&b, " with the quota service (%d bucket rules, reports every %v)", len(q.Buckets), q.ReportInterval)
		}
	}
	fmt.Fprintf(&b, ", store %s", c.Store.Type)
	if c.Store.Type == StoreRedis {
		if c.Store.URL != "" {
			fmt.Fprintf(&b, " %s", redactURL(c.Store.URL))
		} else {
			fmt.Fprintf(&b, " %v", c.Store.Addrs)
		}
		fmt.Fprintf(&b, " %v", c.Store.OnError)
		if c.Store.Fleet != DefaultFleet {
			fmt.Fprintf(&b, " fleet %s", c.Store.Fleet)
		}
	}
	if r := c.Region; r != nil {
		fmt.Fprintf(&b, ", region %s of %d, ledger", r.Name, r.Regions)
		if r.Global.URL != "" {
			fmt.Fprintf(&b, " %s", redactURL(r.Global.URL))
		} else if r.Global.Sentinel != nil {
			fmt.Fprintf(&b, " sentinel %s %v", r.Global.Sentinel.Master, r.Global.Sentinel.Addrs)
		} else {
			fmt.Fprintf(&b, " %v", r.Global.Addrs)
		}
	}
	kinds := make([]string, len(c.Identity))
	for i := range c.Identity {
		kinds[i] = c.Identity[i].Kind()
	}
	fmt.Fprintf(&b, ", identity [%s], %d policies, %d clients, %d routes", strings.Join(kinds, " "), len(c.Policies), len(c.Clients), len(c.Routes))
	return b.String()
}

// GoString implements fmt.GoStringer: %#v prints the summary too.
func (c *Config) GoString() string { return c.String() }

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(invalid URL)"
	}
	return u.Redacted()
}
