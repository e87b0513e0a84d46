package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// designYAML is the realistic file of docs/config.md, unchanged but for real hashes and a comment.
var designYAML = `listen: 127.0.0.1:8080          # the proxy
admin_listen: 127.0.0.1:9090    # /metrics, /healthz, /readyz, /v1/check, the web page
upstream: http://127.0.0.1:9000
store:
  type: redis                   # memory (the default) | redis
  addrs: [127.0.0.1:6379]       # several addresses: Redis Cluster
  on_error: fail-closed         # fail-open | fail-closed | local
identity:                       # first source that names the client wins
  - api_key: {header: X-API-Key}
  - ip: {trusted_proxies: [127.0.0.2/32]}
policies:
  - {name: standard, algorithm: token-bucket, limit: 100, period: 1m, burst: 20}
  - {name: large, algorithm: sliding-window, limit: 500, period: 1m}
  - {name: anonymous, algorithm: fixed-window, limit: 30, period: 1m}
default_policy: anonymous       # clients that no rule names (e.g. limited by IP)
clients:
  - {name: partner-a, api_key_sha256: "` + sum("key-of-partner-a") + `", policy: standard}
  - {name: partner-b, api_key_sha256: "` + sum("key-of-partner-b") + `", policy: large}
routes:                         # optional: cost per operation
  - {method: POST, path_prefix: /reports, cost: 5}
`

// store.slow_timeout: its default, raised to timeout when timeout is longer, and as given.
func TestStoreSlowTimeout(t *testing.T) {
	for _, tc := range []struct {
		store string
		want  time.Duration
	}{
		{"{type: redis, addrs: [r:6379]}", DefaultSlowTimeout},
		{"{type: redis, addrs: [r:6379], timeout: 2s}", 2 * time.Second},
		{"{type: redis, addrs: [r:6379], timeout: 20ms, slow_timeout: 3s}", 3 * time.Second},
		{"{type: redis, addrs: [r:6379], timeout: 20ms, slow_timeout: 20ms}", 20 * time.Millisecond},
	} {
		cfg, err := parseTest(t, "upstream: http://127.0.0.1:9000\nstore: "+tc.store+"\n")
		if err != nil {
			t.Fatalf("%s: %v", tc.store, err)
		}
		if cfg.Store.SlowTimeout != tc.want {
			t.Errorf("%s: slow_timeout %v, want %v", tc.store, cfg.Store.SlowTimeout, tc.want)
		}
	}
}

func TestDesignExample(t *testing.T) {
	cfg, err := parseTest(t, designYAML)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.AdminListen != "127.0.0.1:9090" || cfg.Upstream.String() != "http://127.0.0.1:9000" {
		t.Errorf("listen %q, admin %q, upstream %v", cfg.Listen, cfg.AdminListen, cfg.Upstream)
	}
	s := cfg.Store
	if s.Type != StoreRedis || !slices.Equal(s.Addrs, []string{"127.0.0.1:6379"}) || s.OnError != sluice.FailClosed ||
		s.Timeout != 50*time.Millisecond || s.SlowTimeout != 500*time.Millisecond || s.Prefix != "rate-limit:" {
		t.Errorf("store %+v", s)
	}
	if len(cfg.Identity) != 2 || cfg.Identity[0].APIKey.Header != "X-API-Key" || cfg.Identity[1].IP == nil {
		t.Fatalf("identity %+v", cfg.Identity)
	}
	ip := cfg.Identity[1].IP
	if !slices.Equal(ip.TrustedProxies, []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}) || ip.IPv4Prefix != 32 || ip.IPv6Prefix != 64 {
		t.Errorf("ip %+v", ip)
	}
	want := map[string]sluice.Policy{
		"standard":  {Name: "standard", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Minute, Burst: 20},
		"large":     {Name: "large", Algorithm: sluice.SlidingWindow, Limit: 500, Period: time.Minute},
		"anonymous": {Name: "anonymous", Algorithm: sluice.FixedWindow, Limit: 30, Period: time.Minute},
	}
	for name, w := range want {
		if got, ok := cfg.Policy(name); !ok || got != w {
			t.Errorf("Policy(%q) = %+v, %v; want %+v", name, got, ok, w)
		}
	}
	a, ok := cfg.ClientByAPIKey("key-of-partner-a")
	if !ok || a.Name != "partner-a" {
		t.Fatalf("ClientByAPIKey: %v %v", a, ok)
	}
	if b, ok := cfg.ClientByKeyHash(strings.ToUpper(sum("key-of-partner-b"))); !ok || b.Name != "partner-b" {
		t.Errorf("ClientByKeyHash: %v %v", b, ok)
	}
	if _, ok := cfg.ClientByAPIKey("key-of-nobody"); ok {
		t.Error("an unknown key names a client")
	}
	reports, ok := cfg.Route("POST", "/reports/2024")
	if !ok || reports.Cost != 5 {
		t.Fatalf("Route POST /reports/2024: %+v %v", reports, ok)
	}
	if r, ok := cfg.Route("GET", "/reports"); ok {
		t.Errorf("Route GET /reports = %+v; want none", r)
	}
	names := func(ps []sluice.Policy) (out []string) {
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	for _, c := range []struct {
		client *Client
		route  *Route
		want   []string
	}{
		{a, nil, []string{"standard"}},
		{a, reports, []string{"standard"}},
		{nil, nil, []string{"anonymous"}},
		{nil, reports, []string{"anonymous"}},
	} {
		if got := names(cfg.PoliciesFor(c.client, c.route)); !slices.Equal(got, c.want) {
			t.Errorf("PoliciesFor(%v, %v) = %v; want %v", c.client, c.route, got, c.want)
		}
	}
}

// fullYAML uses every field.
const fullYAML = `
listen: 0.0.0.0:8443
admin_listen: ""
upstream: https://api.internal:9443/v1
tls: {cert_file: cert.pem, key_file: $DIR/key.pem}
store:
  type: redis
  url: rediss://sluice@redis.internal:6380/2
  username: sluice
  password_env: REDIS_PASSWORD
  prefix: "rl:"
  timeout: 20ms
  on_error: local
  local_share: 0.25
  max_keys: 100000
identity:
  - api_key: {header: X-Partner-Key}
  - jwt:
      algorithms: [HS256, HS512]
      secret_env: JWT_SECRET
      claim: client_id
      issuer: https://auth.example
      audience: orders
      leeway: 30s
  - jwt: {header: X-Token, public_key_file: $DIR/ec256.pem}
  - jwt: {algorithms: [RS256, PS384], public_key_file: $DIR/rsa.pem}
  - jwt: {public_key_file: $DIR/ed25519.pem, secret_env: JWT_SECRET}
  - ip:
      trusted_proxies: [10.0.0.0/8, 192.168.1.1, "fd00::/8", "::ffff:172.16.0.0/108"]
      ipv4_prefix: 24
      ipv6_prefix: 56
      forwarded_header: x-forwarded-for
x-defaults: &defaults {algorithm: token-bucket, period: 1s}
policies:
  - {<<: *defaults, name: per-second, limit: 10, burst: 20}
  - {name: per-day, algorithm: fixed-window, limit: 10000, period: 24h}
  - {name: gold, algorithm: sliding-log, limit: 1000, period: 1m, dry_run: true}
  - {name: queue, algorithm: leaky-bucket, limit: 5, period: 1s, burst: 10}
  - {name: anon, algorithm: sliding-window, limit: 60, period: 1m}
default_policy: anon
clients:
  - name: Partner-A
    api_key_sha256: [` + "\"$SUM_A1\", \"$SUM_A2\"" + `]
    policy: [per-second, per-day]
  - {name: partner-b, jwt_subject: 12345, policy: gold}
  - {name: partner-c, api_key_sha256: "$SUM_C", jwt_subject: svc-c}
routes:
  - {path_prefix: /orders, scope: orders-api}
  - {method: get, path_prefix: /orders, cost: 0}
  - {method: POST, path_prefix: /orders/bulk, cost: 10, policy: queue, scope: bulk}
  - {path_prefix: /, cost: 1}
limits: {max_delay: 2s, legacy_headers: true}
`

func TestFullFeatured(t *testing.T) {
	dir := fixtures(t)
	// The file is in dir, so that the relative cert.pem is dir's.
	y := strings.NewReplacer("$SUM_A1", sum("a1"), "$SUM_A2", strings.ToUpper(sum("a2")), "$SUM_C", sum("c"), "$DIR", dir).Replace(fullYAML)
	cfg, err := parse([]byte(y), filepath.Join(dir, "sluice.yaml"), lookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "0.0.0.0:8443" || cfg.AdminListen != "" || cfg.Upstream.String() != "https://api.internal:9443/v1" {
		t.Errorf("listen %q admin %q upstream %v", cfg.Listen, cfg.AdminListen, cfg.Upstream)
	}
	if cfg.TLS == nil || cfg.TLS.CertFile != filepath.Join(dir, "cert.pem") || cfg.TLS.KeyFile != filepath.Join(dir, "key.pem") {
		t.Errorf("tls %+v", cfg.TLS)
	}
	s := cfg.Store
	if s.Type != StoreRedis || s.URL != "rediss://sluice@redis.internal:6380/2" || s.Username != "sluice" ||
		s.Password.Value() != testEnv["REDIS_PASSWORD"] || s.PasswordEnv != "REDIS_PASSWORD" || s.Prefix != "rl:" ||
		s.Timeout != 20*time.Millisecond || s.OnError != sluice.FailLocal || s.LocalShare != 0.25 || s.MaxKeys != 100000 {
		t.Errorf("store %+v", s)
	}
	if len(cfg.Identity) != 6 {
		t.Fatalf("identity: %d sources", len(cfg.Identity))
	}
	kinds := []string{}
	for _, id := range cfg.Identity {
		kinds = append(kinds, id.Kind())
	}
	if !slices.Equal(kinds, []string{"api_key", "jwt", "jwt", "jwt", "jwt", "ip"}) || cfg.Identity[1].Line != 18 {
		t.Errorf("identity kinds %v, line %d", kinds, cfg.Identity[1].Line)
	}
	if h := cfg.Identity[0].APIKey.Header; h != "X-Partner-Key" {
		t.Errorf("api_key header %q", h)
	}
	hs := cfg.Identity[1].JWT
	if hs.Header != "Authorization" || !slices.Equal(hs.Algorithms, []string{"HS256", "HS512"}) ||
		hs.Secret.Value() != testEnv["JWT_SECRET"] || hs.Claim != "client_id" || hs.Issuer != "https://auth.example" ||
		hs.Audience != "orders" || hs.Leeway != 30*time.Second || hs.PublicKey != nil {
		t.Errorf("jwt HS %+v", hs)
	}
	es := cfg.Identity[2].JWT
	if _, ok := es.PublicKey.(*ecdsa.PublicKey); !ok || es.Header != "X-Token" ||
		!slices.Equal(es.Algorithms, []string{"ES256"}) || es.Claim != "sub" || !es.Secret.IsZero() {
		t.Errorf("jwt ES %+v", es)
	}
	rs := cfg.Identity[3].JWT
	if _, ok := rs.PublicKey.(*rsa.PublicKey); !ok || !slices.Equal(rs.Algorithms, []string{"RS256", "PS384"}) {
		t.Errorf("jwt RS %+v", rs)
	}
	// Both a secret and a key, no algorithms: HS256 and the key's usual one.
	ed := cfg.Identity[4].JWT
	if _, ok := ed.PublicKey.(ed25519.PublicKey); !ok || !slices.Equal(ed.Algorithms, []string{"HS256", "EdDSA"}) || ed.Secret.IsZero() {
		t.Errorf("jwt EdDSA %+v", ed)
	}
	ip := cfg.Identity[5].IP
	wantProxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32"),
		netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("172.16.0.0/12")}
	if !slices.Equal(ip.TrustedProxies, wantProxies) || ip.IPv4Prefix != 24 || ip.IPv6Prefix != 56 || ip.ForwardedHeader != "X-Forwarded-For" {
		t.Errorf("ip %+v", ip)
	}

	perSecond, _ := cfg.Policy("per-second")
	if perSecond != (sluice.Policy{Name: "per-second", Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}) {
		t.Errorf("per-second (merged from an anchor) = %+v", perSecond)
	}
	if gold, ok := cfg.Applied("gold"); !ok || !gold.DryRun || gold.Policy.Algorithm != sluice.SlidingLog {
		t.Errorf("Applied(gold) = %+v", gold)
	}
	if _, ok := cfg.Policy("defaults"); ok {
		t.Error("the anchor's holder is a policy")
	}

	a, ok := cfg.ClientByAPIKey("a2")
	if !ok || a.Name != "Partner-A" || !slices.Equal(a.APIKeySHA256, []string{sum("a1"), sum("a2")}) {
		t.Fatalf("ClientByAPIKey(a2) = %+v, %v (hashes are lower-cased)", a, ok)
	}
	if a1, _ := cfg.ClientByKeyHash(sum("a1")); a1 != a {
		t.Error("ClientByKeyHash(a1)")
	}
	b, ok := cfg.ClientBySubject("12345")
	if !ok || b.Name != "partner-b" {
		t.Fatalf("ClientBySubject(12345) = %+v, %v", b, ok)
	}
	c, _ := cfg.ClientBySubject("svc-c")
	if c2, _ := cfg.ClientByAPIKey("c"); c2 != c || c == nil {
		t.Error("partner-c by key and by subject")
	}
	if n, _ := cfg.ClientByName("partner-b"); n != b {
		t.Error("ClientByName")
	}

	// Routes: longest prefix first, then the method's route before any method's.
	for _, rc := range []struct{ method, path, want string }{
		{"GET", "/orders/1", "GET /orders"},
		{"POST", "/orders/1", " /orders"},
		{"POST", "/orders/bulk/x", "POST /orders/bulk"},
		{"GET", "/orders/bulk/x", "GET /orders"},
		{"GET", "/other", " /"},
		{"GET", "/ordersX", "GET /orders"}, // a prefix is a prefix of bytes, not of segments
	} {
		r, ok := cfg.Route(rc.method, rc.path)
		if !ok || r.Method+" "+r.PathPrefix != rc.want {
			t.Errorf("Route(%s %s) = %+v; want %q", rc.method, rc.path, r, rc.want)
		}
	}
	if r, _ := cfg.Route("GET", "/orders"); r.Method != "GET" || r.Cost != 0 {
		t.Errorf("method upper-cased, cost 0 kept: %+v", r)
	}
	orders, _ := cfg.Route("POST", "/orders")
	bulk, _ := cfg.Route("POST", "/orders/bulk")
	any, _ := cfg.Route("GET", "/")
	type applied struct {
		name, policy string
		dry          bool
	}
	for _, pc := range []struct {
		client *Client
		route  *Route
		want   []applied
	}{
		{a, nil, []applied{{"per-second", "per-second", false}, {"per-day", "per-day", false}}},
		{a, any, []applied{{"per-second", "per-second", false}, {"per-day", "per-day", false}}},
		{a, orders, []applied{{"orders-api/per-second", "per-second", false}, {"orders-api/per-day", "per-day", false}}},
		{a, bulk, []applied{{"bulk", "queue", false}}},
		{b, orders, []applied{{"orders-api", "gold", true}}},
		{c, nil, []applied{{"anon", "anon", false}}}, // no policy of its own: the default
		{c, orders, []applied{{"orders-api", "anon", false}}},
		{nil, nil, []applied{{"anon", "anon", false}}},
		{nil, orders, []applied{{"orders-api", "anon", false}}},
		{nil, bulk, []applied{{"bulk", "queue", false}}},
	} {
		var got []applied
		for _, ap := range cfg.AppliedPoliciesFor(pc.client, pc.route) {
			got = append(got, applied{ap.Policy.Name, ap.PolicyName, ap.DryRun})
		}
		ps := cfg.PoliciesFor(pc.client, pc.route)
		if !slices.Equal(got, pc.want) || len(ps) != len(got) || (len(ps) > 0 && ps[0].Name != got[0].name) {
			t.Errorf("for %v on %v: %v; want %v", pc.client, pc.route, got, pc.want)
		}
	}
	if cfg.Limits.MaxDelay != 2*time.Second || !cfg.Limits.LegacyHeaders {
		t.Errorf("limits %+v", cfg.Limits)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		cl, _ := cfg.ClientByAPIKey("a1")
		r, _ := cfg.Route("POST", "/orders/7")
		_ = cfg.PoliciesFor(cl, r)
	}); allocs != 0 {
		t.Errorf("lookups allocate %v times; want 0", allocs)
	}
}

func TestServerSection(t *testing.T) {
	cfg, err := parseTest(t, up+"server: {body_timeout: 1500ms, body_min_rate: 0, body_memory: 8388608, drain_timeout: 0s}\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server != (Server{BodyTimeout: 1500 * time.Millisecond, BodyMinRate: 0, BodyMemory: 8 << 20, DrainTimeout: 0}) {
		t.Errorf("server %+v", cfg.Server)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := parseTest(t, "upstream: http://127.0.0.1:9000\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != DefaultListen || cfg.AdminListen != DefaultAdminListen || cfg.TLS != nil {
		t.Errorf("listen %q admin %q tls %v", cfg.Listen, cfg.AdminListen, cfg.TLS)
	}
	s := cfg.Store
	if s.Type != StoreMemory || s.OnError != sluice.FailClosed || s.LocalShare != LocalShareFleet || s.Timeout != 50*time.Millisecond || s.MaxKeys != 0 {
		t.Errorf("store %+v", s)
	}
	if len(cfg.Identity) != 2 || cfg.Identity[0].APIKey == nil || cfg.Identity[0].APIKey.Header != "X-API-Key" ||
		cfg.Identity[1].IP == nil || cfg.Identity[1].IP.IPv6Prefix != 64 || cfg.Identity[1].IP.IPv4Prefix != 32 {
		t.Errorf("identity %+v", cfg.Identity)
	}
	if cfg.Limits.MaxDelay != 10*time.Second || cfg.Limits.LegacyHeaders {
		t.Errorf("limits %+v", cfg.Limits)
	}
	if cfg.Server != (Server{BodyTimeout: 10 * time.Second, BodyMinRate: 1024, BodyMemory: 64 << 20, DrainTimeout: 30 * time.Second}) {
		t.Errorf("server %+v", cfg.Server)
	}
	if ps := cfg.PoliciesFor(nil, nil); len(ps) != 0 {
		t.Errorf("no default_policy: %v", ps)
	}

	// Defaults inside items.
	cfg, err = parseTest(t, `upstream: http://u
identity:
  - api_key:
  - jwt: {secret_env: JWT_SECRET}
  - ip: {}
policies: [{name: p, algorithm: token-bucket, limit: 5, period: 1s}]
routes: [{path_prefix: /x}]
`)
	if err != nil {
		t.Fatal(err)
	}
	j := cfg.Identity[1].JWT
	if cfg.Identity[0].APIKey.Header != "X-API-Key" || j.Header != "Authorization" ||
		!slices.Equal(j.Algorithms, []string{"HS256"}) || j.Claim != "sub" || j.Leeway != 0 {
		t.Errorf("identity %+v %+v", cfg.Identity[0].APIKey, j)
	}
	if p := cfg.Policies[0]; p.Burst != 0 || p.DryRun || p.Line != 6 {
		t.Errorf("policy %+v", p)
	}
	if r := cfg.Routes[0]; r.Cost != 1 || r.Method != "" || r.Policy != nil || r.Scope != "" {
		t.Errorf("route %+v", r)
	}
}

// TestRedisTakesEveryValidPolicy: on the Redis store, a policy is bounded only as on the memory
// store (Policy.Validate): large daily and monthly contracts and the extremes load.
func TestRedisTakesEveryValidPolicy(t *testing.T) {
	cfg, err := parseTest(t, `upstream: http://127.0.0.1:9000
store: {type: redis, addrs: [127.0.0.1:6379]}
policies:
  - {name: daily, algorithm: sliding-window, limit: 100000, period: 24h}
  - {name: monthly, algorithm: token-bucket, limit: 1000000, period: 720h, burst: 1000000}
  - {name: hourly, algorithm: leaky-bucket, limit: 700000, period: 1h, burst: 699999}
  - {name: huge, algorithm: token-bucket, limit: 100000000, period: 24h}
  - {name: most, algorithm: sliding-window, limit: 9007199254740992, period: 2562047h}
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Policies) != 5 || cfg.Policies[4].Limit != 1<<53 || cfg.Policies[4].Period != 2562047*time.Hour {
		t.Errorf("policies %+v", cfg.Policies)
	}
}

// BenchmarkLookup is the gateway's per-request path through a configuration: the client by its
// key, the route, the policies. The baseline is hashing the key alone, which ClientByAPIKey must do.
func BenchmarkLookup(b *testing.B) {
	cfg, err := parseTest(b, designYAML)
	if err != nil {
		b.Fatal(err)
	}
	key := "key-of-partner-a"
	b.Run("sha256-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = sha256.Sum256([]byte(key))
		}
	})
	b.Run("client-route-policies", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cl, _ := cfg.ClientByAPIKey(key)
			r, _ := cfg.Route("POST", "/reports/2024")
			if len(cfg.PoliciesFor(cl, r)) != 1 {
				b.Fatal("no policy")
			}
		}
	})
}

func TestLogSection(t *testing.T) {
	cfg, err := Parse([]byte("upstream: http://127.0.0.1:9\nlog: {format: json, level: debug}\n"), "log.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Log.Format != LogJSON || cfg.Log.Level != slog.LevelDebug {
		t.Errorf("log %+v", cfg.Log)
	}
	cfg, err = Parse([]byte("upstream: http://127.0.0.1:9\n"), "log.yaml")
	if err != nil || cfg.Log.Format != LogText || cfg.Log.Level != slog.LevelInfo {
		t.Errorf("default log %+v (%v)", cfg.Log, err)
	}
}

// TestLocalBudget: a policy's local_budget is read, and found under the name its state is kept
// under: the policy's own, and a route's scope over it.
func TestLocalBudget(t *testing.T) {
	cfg, err := parseTest(t, up+`policies:
  - {name: hot, algorithm: token-bucket, limit: 100, period: 1s, local_budget: {size: 10, max_age: 50ms}}
  - {name: plain, algorithm: fixed-window, limit: 5, period: 1s}
default_policy: plain
routes:
  - {path_prefix: /search, policy: hot, scope: search}
`)
	if err != nil {
		t.Fatal(err)
	}
	want := sluice.LocalBudget{Size: 10, MaxAge: 50 * time.Millisecond}
	if got := cfg.Policies[0].LocalBudget; got != want {
		t.Fatalf("hot's local_budget %+v; want %+v", got, want)
	}
	for name, want := range map[string]sluice.LocalBudget{"hot": want, "search": want, "plain": {}, "none": {}} {
		if got := cfg.LocalBudget(name); got != want {
			t.Errorf("LocalBudget(%q) = %+v; want %+v", name, got, want)
		}
	}
}
