package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// wantErr is one expected error: its line and words its text must contain.
type wantErr struct {
	line  int
	words []string
}

func at(line int, words ...string) wantErr { return wantErr{line, words} }

// up is a valid first line, so that the cases' own lines start at 2.
const up = "upstream: http://127.0.0.1:9000\n"

var hashA = sum("a")

// errorCases are bad files and the errors each must give, in order. FuzzParse starts from them.
var errorCases = []struct {
	name string
	yaml string
	want []wantErr
}{
	// Syntax.
	{"syntax: unclosed flow", up + "policies: [\n", []wantErr{at(2, "YAML")}},
	{"syntax: bad indentation", up + "store:\n  type: redis\n addrs: [x]\n", []wantErr{at(3, "YAML", "check the indentation")}},
	{"syntax: tab", up + "store:\n\ttype: redis\n", []wantErr{at(3, "YAML", "tab")}},
	{"syntax: unknown anchor", up + "default_policy: *nope\n", []wantErr{at(2, "YAML", "anchor")}},
	{"syntax: second document", up + "---\nlisten: x\n", []wantErr{at(2, "second YAML document")}},
	{"duplicate key", up + "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", []wantErr{at(3, "listen is set twice", "line 2")}},
	{"top level not a mapping", "- upstream: x\n", []wantErr{at(1, "must be a mapping", "a list")}},
	{"empty file", "", []wantErr{at(1, "upstream is required")}},

	// Wrong types.
	{"type: limit", up + "policies:\n  - {name: gold, algorithm: token-bucket, limit: abc, period: 1m}\n",
		[]wantErr{at(3, `policies[0] "gold": limit "abc" must be an integer`)}},
	{"type: limit float", up + "policies:\n  - {name: gold, algorithm: token-bucket, limit: 1.5, period: 1m}\n",
		[]wantErr{at(3, `limit 1.5 must be an integer`)}},
	{"type: quoted number", up + "policies:\n  - {name: gold, algorithm: token-bucket, limit: \"10\", period: 1m}\n",
		[]wantErr{at(3, `limit "10" must be an integer`)}},
	{"type: store", up + "store: redis\n", []wantErr{at(2, `store must be a mapping`, `"redis"`)}},
	{"type: policies", up + "policies:\n  name: gold\n", []wantErr{at(3, "policies must be a list, not a mapping")}},
	{"type: policy item", up + "policies: [gold]\n", []wantErr{at(2, "policies[0]", "must be a mapping", `"gold"`)}},
	{"type: dry_run", up + "policies:\n  - {name: g, algorithm: fixed-window, limit: 1, period: 1s, dry_run: yes}\n",
		[]wantErr{at(3, `dry_run "yes" must be true or false`)}},
	{"type: legacy_headers", up + "limits:\n  legacy_headers: 1\n", []wantErr{at(3, "limits: legacy_headers 1 must be true or false")}},
	{"type: addrs", up + "store: {type: redis, addrs: 127.0.0.1:6379}\n", []wantErr{at(2, "addrs must be a list")}},
	{"type: listen", up + "listen: [a]\n", []wantErr{at(2, "listen must be a string, not a list")}},
	{"type: ipv6_prefix", up + "identity:\n  - ip: {ipv6_prefix: /64}\n", []wantErr{at(3, `ipv6_prefix "/64" must be an integer`)}},
	{"type: identity item", up + "identity:\n  - api_key\n", []wantErr{at(3, "identity[0]", "must be a mapping")}},
	{"type: client policy", up + "clients:\n  - {name: a, api_key_sha256: " + hashA + ", policy: {x: 1}}\n",
		[]wantErr{at(3, "policy must be a name or a list of names")}},

	// Unknown fields, at every level.
	{"unknown: top level", "upstrem: http://x\n", []wantErr{at(1, `unknown field "upstrem"`, `did you mean "upstream"`), at(1, "upstream is required")}},
	{"unknown: top level, no suggestion", up + "colour: blue\n", []wantErr{at(2, `unknown field "colour"`, "known: listen, admin_listen")}},
	{"unknown: store", up + "store:\n  type: redis\n  addrs: [r:6379]\n  tpye: x\n", []wantErr{at(5, `store: unknown field "tpye"`, `did you mean "type"`)}},
	{"unknown: tls", up + "tls: {cert: a.pem}\n", []wantErr{at(2, `tls: unknown field "cert"`)}},
	{"unknown: identity source", up + "identity:\n  - api-key: {}\n", []wantErr{at(3, `identity[0]: unknown field "api-key"`, `did you mean "api_key"`)}},
	{"unknown: api_key", up + "identity:\n  - api_key: {heder: X}\n", []wantErr{at(3, `identity[0] api_key: unknown field "heder"`)}},
	{"unknown: jwt", up + "identity:\n  - jwt:\n      secret_env: JWT_SECRET\n      audiences: [x]\n",
		[]wantErr{at(5, `identity[0] jwt: unknown field "audiences"`, `did you mean "audience"`)}},
	{"unknown: ip", up + "identity:\n  - ip: {trusted: [10.0.0.0/8]}\n", []wantErr{at(3, `identity[0] ip: unknown field "trusted"`)}},
	{"unknown: policy", up + "policies:\n  - name: gold\n    algorithm: token-bucket\n    limit: 5\n    period: 1s\n    brust: 3\n",
		[]wantErr{at(7, `policies[0] "gold": unknown field "brust"`, `did you mean "burst"`)}},
	{"unknown: client", up + "clients:\n  - {name: a, api_key_sha256: " + hashA + ", polcy: x}\n", []wantErr{at(3, `clients[0] "a": unknown field "polcy"`)}},
	{"unknown: route", up + "routes:\n  - {path_prefix: /r, cots: 5}\n", []wantErr{at(3, `routes[0] "/r": unknown field "cots"`, `"cost"`)}},
	{"unknown: limits", up + "limits: {max-delay: 1s}\n", []wantErr{at(2, `limits: unknown field "max-delay"`, `did you mean "max_delay"`)}},

	// Unknown policy names.
	{"unknown policy: default", up + "policies: [{name: a, algorithm: fixed-window, limit: 1, period: 1s}]\ndefault_policy: gold\n",
		[]wantErr{at(3, `default_policy "gold" is not defined in policies (known: a)`)}},
	{"unknown policy: default list", up + "policies: [{name: a, algorithm: fixed-window, limit: 1, period: 1s}]\ndefault_policy:\n  - a\n  - b\n",
		[]wantErr{at(5, `default_policy[1] "b" is not defined`)}},
	{"unknown policy: client", up + "clients:\n  - {name: a, api_key_sha256: " + hashA + ", policy: gold}\n",
		[]wantErr{at(3, `clients[0] "a": policy "gold" is not defined in policies (no policies are configured)`)}},
	{"unknown policy: route", up + "routes:\n  - {path_prefix: /r, policy: [gold]}\n", []wantErr{at(3, `routes[0] "/r": policy "gold" is not defined`)}},
	{"policy listed twice", up + "policies: [{name: a, algorithm: fixed-window, limit: 1, period: 1s}]\ndefault_policy: [a, a]\n",
		[]wantErr{at(3, `default_policy[1] "a" is listed twice`)}},

	// CIDRs.
	{"cidr: bits", up + "identity:\n  - ip: {trusted_proxies: [10.0.0.0/33]}\n", []wantErr{at(3, `trusted_proxies[0] "10.0.0.0/33" is not a CIDR`)}},
	{"cidr: host bits", up + "identity:\n  - ip:\n      trusted_proxies:\n        - 10.0.0.0/8\n        - 10.1.2.3/16\n",
		[]wantErr{at(6, `identity[0] ip: trusted_proxies[1] "10.1.2.3/16" has bits set past the prefix; did you mean 10.1.0.0/16?`)}},
	{"cidr: not an address", up + "identity:\n  - ip: {trusted_proxies: [proxy.local]}\n", []wantErr{at(3, `"proxy.local" is not an IP address or CIDR`)}},
	{"ipv6_prefix range", up + "identity:\n  - ip: {ipv6_prefix: 129, ipv4_prefix: 0}\n",
		[]wantErr{at(3, "ipv6_prefix 129 must be from 1 to 128"), at(3, "ipv4_prefix 0 must be from 1 to 32")}},

	// Secrets and keys.
	{"missing secret: env unset", up + "identity:\n  - jwt: {algorithms: [HS256], secret_env: NOT_SET}\n",
		[]wantErr{at(3, "missing secret", "NOT_SET", "unset or empty")}},
	{"missing secret: env empty", up + "identity:\n  - jwt:\n      secret_env: EMPTY\n", []wantErr{at(4, "missing secret", "EMPTY")}},
	{"missing secret: no secret_env", up + "identity:\n  - jwt:\n      algorithms: [HS256]\n", []wantErr{at(4, "missing secret", "secret_env")}},
	{"missing secret: nothing", up + "identity:\n  - jwt: {claim: sub}\n", []wantErr{at(3, "missing secret", "secret_env", "public_key_file")}},
	{"secret too short", up + "identity:\n  - jwt: {secret_env: SHORT_SECRET}\n", []wantErr{at(3, "SHORT_SECRET is 9 bytes; HS256 needs at least 32")}},
	{"secret without HS", up + "identity:\n  - jwt: {algorithms: [RS256], secret_env: JWT_SECRET, public_key_file: $DIR/rsa.pem}\n",
		[]wantErr{at(3, "secret_env has no use without an HS algorithm")}},
	{"missing public key file", up + "identity:\n  - jwt:\n      algorithms: [RS256]\n      public_key_file: /nonexistent/key.pem\n",
		[]wantErr{at(5, `public_key_file "/nonexistent/key.pem" cannot be read: no such file or directory`)}},
	{"public key: no file given", up + "identity:\n  - jwt: {algorithms: [ES256]}\n", []wantErr{at(3, "missing key", "public_key_file")}},
	{"public key: wrong type", up + "identity:\n  - jwt: {algorithms: [RS256], public_key_file: $DIR/ec256.pem}\n",
		[]wantErr{at(3, "holds an ECDSA P-256 key, which cannot verify RS256")}},
	{"public key: wrong curve", up + "identity:\n  - jwt: {algorithms: [ES256], public_key_file: $DIR/ec384.pem}\n",
		[]wantErr{at(3, "P-384 key, which cannot verify ES256")}},
	{"public key: not PEM", up + "identity:\n  - jwt: {public_key_file: $DIR/garbage.pem}\n", []wantErr{at(3, "is not PEM")}},
	{"public key: private key", up + "identity:\n  - jwt: {public_key_file: $DIR/private.pem}\n", []wantErr{at(3, `holds a "EC PRIVATE KEY"; want a PUBLIC KEY`)}},
	{"public key: a directory", up + "identity:\n  - jwt: {public_key_file: $DIR}\n", []wantErr{at(3, "cannot be read: not a regular file")}},
	{"jwt algorithm unknown", up + "identity:\n  - jwt: {algorithms: [HS256, none], secret_env: JWT_SECRET}\n",
		[]wantErr{at(3, `algorithms[1] "none" is not supported`)}},
	{"redis password_env unset", up + "store: {type: redis, addrs: [r:6379], password_env: NO_SUCH_VAR}\n",
		[]wantErr{at(2, "store: missing password: the environment variable NO_SUCH_VAR named by password_env is unset or empty")}},
	{"redis password twice", up + "store: {type: redis, addrs: [r:6379], password: x, password_env: REDIS_PASSWORD}\n",
		[]wantErr{at(2, "password_env and password are both set")}},
	{"redis url with password", up + "store: {type: redis, url: \"redis://u:hunter2@r:6379\"}\n",
		[]wantErr{at(2, "url must not contain the password")}},

	// Duplicates.
	{"duplicate policy", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 1, period: 1s}\n  - {name: a, algorithm: fixed-window, limit: 2, period: 1s}\n",
		[]wantErr{at(4, `policies[1] "a": name "a" is already used at line 3`)}},
	{"duplicate client", up + "clients:\n  - {name: a, api_key_sha256: " + hashA + "}\n  - {name: a, api_key_sha256: " + sum("b") + "}\n",
		[]wantErr{at(4, `clients[1] "a": name "a" is already used at line 3`)}},
	{"duplicate hash", up + "clients:\n  - {name: a, api_key_sha256: " + hashA + "}\n  - {name: b, api_key_sha256: " + strings.ToUpper(hashA) + "}\n",
		[]wantErr{at(4, `clients[1] "b": api_key_sha256 `+hashA[:8]+`… is already a key at line 3`)}},
	{"duplicate subject", up + "identity: [jwt: {secret_env: JWT_SECRET}]\nclients:\n  - {name: a, jwt_subject: s}\n  - {name: b, jwt_subject: s}\n",
		[]wantErr{at(5, `jwt_subject "s" is already a client's at line 4`)}},
	{"duplicate route", up + "routes:\n  - {method: GET, path_prefix: /a}\n  - {method: get, path_prefix: /a}\n",
		[]wantErr{at(4, "GET /a is already a route at line 3")}},

	// Durations.
	{"duration: unit", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 1, period: 1x}\n", []wantErr{at(3, `period "1x" is not a duration`)}},
	{"duration: no unit", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 1, period: 60}\n", []wantErr{at(3, `period 60 has no unit (e.g. 60s`)}},
	{"duration: days", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 1, period: 1d}\n", []wantErr{at(3, "there is no unit d")}},
	{"duration: too short", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 1, period: 100us}\n", []wantErr{at(3, "period 100µs must be ≥ 1ms")}},
	{"duration: timeout negative", up + "store: {type: redis, addrs: [r:6379], timeout: -1s}\n", []wantErr{at(2, "timeout -1s must be > 0")}},
	{"duration: slow_timeout below timeout", up + "store:\n  type: redis\n  addrs: [r:6379]\n  timeout: 100ms\n  slow_timeout: 80ms\n",
		[]wantErr{at(6, "store: slow_timeout 80ms must be ≥ timeout (100ms)")}},
	{"duration: leeway", up + "identity:\n  - jwt: {secret_env: JWT_SECRET, leeway: soon}\n", []wantErr{at(3, `leeway "soon" is not a duration`)}},
	{"duration: max_delay", up + "limits:\n  max_delay: -5s\n", []wantErr{at(3, "max_delay -5s must be ≥ 0")}},

	// Policies.
	{"bad algorithm", up + "policies:\n  - {name: a, algorithm: token_bucket, limit: 1, period: 1s}\n",
		[]wantErr{at(3, `algorithm "token_bucket" is unknown`, "token-bucket")}},
	{"burst on a window", up + "policies:\n  - name: a\n    algorithm: sliding-window\n    limit: 10\n    period: 1s\n    burst: 5\n",
		[]wantErr{at(7, `policies[0] "a": burst 5 has no meaning for sliding-window`)}},
	{"burst negative", up + "policies:\n  - name: gold\n    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    burst: -5\n",
		[]wantErr{at(7, `policies[0] "gold": burst -5 must be ≥ 0`)}},
	// local_budget: each problem at its field's line, naming the field.
	{"local_budget on sliding-log", up + "policies:\n  - name: a\n    algorithm: sliding-log\n    limit: 10\n    period: 1s\n    local_budget: {size: 2, max_age: 1s}\n",
		[]wantErr{at(7, `policies[0] "a": local_budget is not supported by sliding-log`)}},
	{"local_budget on leaky-bucket", up + "policies:\n  - name: a\n    algorithm: leaky-bucket\n    limit: 10\n    period: 1s\n    local_budget: {size: 2, max_age: 1s}\n",
		[]wantErr{at(7, `policies[0] "a": local_budget is not supported by leaky-bucket`)}},
	{"local_budget size above limit", up + "policies:\n  - name: a\n    algorithm: fixed-window\n    limit: 10\n    period: 1s\n    local_budget:\n      size: 11\n      max_age: 1s\n",
		[]wantErr{at(8, `policies[0] "a": local_budget.size 11 must be ≤ the policy's limit 10`)}},
	{"local_budget bad fields", up + "policies:\n  - name: a\n    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    local_budget:\n      size: 0\n      max_age: 0s\n      sise: 1\n",
		[]wantErr{at(8, `local_budget.size 0 must be > 0`), at(10, `unknown field "sise"`, `did you mean "size"`)}},
	{"local_budget max_age", up + "policies:\n  - name: a\n    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    local_budget: {size: 1, max_age: 10us}\n",
		[]wantErr{at(7, `local_budget.max_age 10µs must be ≥ 1ms`)}},
	{"local_budget missing fields", up + "policies:\n  - {name: a, algorithm: token-bucket, limit: 10, period: 1s, local_budget: {}}\n",
		[]wantErr{at(3, `local_budget.size is required`), at(3, `local_budget.max_age is required`)}},
	{"local_budget not a mapping", up + "policies:\n  - {name: a, algorithm: token-bucket, limit: 10, period: 1s, local_budget: 5}\n",
		[]wantErr{at(3, `local_budget must be a mapping`)}},
	{"limit zero", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 0, period: 1s}\n", []wantErr{at(3, "limit 0 must be > 0")}},
	{"policy fields missing", up + "policies:\n  - {name: a}\n", []wantErr{at(3, "algorithm is required"), at(3, "limit is required"), at(3, "period is required")}},
	// Every problem of one policy, each at its own line: Validate alone stops at the first.
	{"policy: bad limit, period and burst", up + "policies:\n  - name: a\n    algorithm: token-bucket\n    limit: 0\n    period: 100us\n    burst: -1\n",
		[]wantErr{at(5, `policies[0] "a": limit 0 must be > 0`), at(6, `policies[0] "a": period 100µs must be ≥ 1ms`), at(7, `policies[0] "a": burst -1 must be ≥ 0`)}},
	{"policy: bad name and bad limit", up + "policies:\n  - {name: Gold Plan, algorithm: fixed-window, limit: -3, period: 1s}\n",
		[]wantErr{at(3, `name "Gold Plan" may only have a-z`), at(3, "limit -3 must be > 0")}},
	{"policy: bad algorithm and bad period", up + "policies:\n  - name: a\n    algorithm: bucket\n    limit: 5\n    period: 1500ns\n",
		[]wantErr{at(4, `algorithm "bucket" is unknown`), at(6, "period 1.5µs must be ≥ 1ms")}},
	{"policy name", up + "policies:\n  - {name: Gold Plan, algorithm: fixed-window, limit: 1, period: 1s}\n", []wantErr{at(3, `name "Gold Plan" may only have a-z`)}},
	{"policy without name", up + "policies:\n  - {algorithm: fixed-window, limit: 1, period: 1s}\n", []wantErr{at(3, "policies[0]: name is required")}},

	// Clients.
	{"hash: not hex", up + "clients:\n  - {name: a, api_key_sha256: " + strings.Repeat("g", 64) + "}\n", []wantErr{at(3, "must be 64 hex digits (0-9, a-f)")}},
	{"hash: short", up + "clients:\n  - {name: a, api_key_sha256: abc123}\n", []wantErr{at(3, "must be 64 hex digits", "not 6 characters")}},
	{"hash: list item", up + "clients:\n  - name: a\n    api_key_sha256:\n      - " + hashA + "\n      - nothex\n", []wantErr{at(6, `api_key_sha256 "nothex"`)}},
	{"client unknown", up + "clients:\n  - {name: a, policy: x}\n", []wantErr{at(3, "api_key_sha256 or jwt_subject is required"), at(3, `policy "x" is not defined`)}},
	{"client subject without jwt source", up + "clients:\n  - {name: a, jwt_subject: s}\n", []wantErr{at(3, "jwt_subject is never matched: identity has no jwt source")}},
	{"client key without api_key source", up + "identity: [ip: {}]\nclients:\n  - {name: a, api_key_sha256: " + hashA + "}\n",
		[]wantErr{at(4, "api_key_sha256 is never matched")}},
	{"client name reserved", up + "clients:\n  - {name: anonymous, api_key_sha256: " + hashA + "}\n", []wantErr{at(3, `name "anonymous" is the key of clients that no source names`)}},
	{"client name", up + "clients:\n  - {name: \"a{b}\", api_key_sha256: " + hashA + "}\n", []wantErr{at(3, `name "a{b}" may only have`)}},

	// Store.
	{"redis without addrs", up + "store:\n  type: redis\n", []wantErr{at(3, "store: the redis store needs addrs")}},
	{"redis addrs and url", up + "store: {type: redis, addrs: [r:6379], url: \"redis://r:6379\"}\n", []wantErr{at(2, "url and addrs are both set")}},
	{"redis bad addr", up + "store: {type: redis, addrs: [r:6379, redis.local]}\n", []wantErr{at(2, `addrs[1] "redis.local" is not host:port`)}},
	{"redis url scheme", up + "store: {type: redis, url: \"http://r:6379\"}\n", []wantErr{at(2, "url must start with redis:// or rediss://")}},
	{"addrs on memory", up + "store:\n  addrs: [r:6379]\n", []wantErr{at(3, "addrs has no meaning for the memory store (is type: redis missing?)")}},
	{"store type", up + "store: {type: postgres}\n", []wantErr{at(2, `type "postgres" must be memory or redis`)}},
	{"on_error unknown", up + "store:\n  type: redis\n  addrs: [r:6379]\n  on_error: retry\n", []wantErr{at(5, `on_error "retry" must be fail-open, fail-closed or local`)}},
	{"local_share zero", up + "store: {type: redis, addrs: [r:6379], on_error: local, local_share: 0}\n", []wantErr{at(2, "local_share 0 must be in (0, 1]")}},
	{"local_share above 1", up + "store: {type: redis, addrs: [r:6379], on_error: local, local_share: 1.5}\n", []wantErr{at(2, "local_share 1.5 must be in (0, 1]")}},
	{"local_share type", up + "store: {type: redis, addrs: [r:6379], local_share: half}\n", []wantErr{at(2, `local_share "half" must be fleet`, "or a number in (0, 1]")}},
	{"local_share list", up + "store: {type: redis, addrs: [r:6379], local_share: [0.5]}\n", []wantErr{at(2, "local_share", "must be a number")}},
	{"fleet syntax", up + "store:\n  type: redis\n  addrs: [r:6379]\n  fleet: api gateway\n", []wantErr{at(5, `fleet "api gateway" may only have A-Z, a-z, 0-9, '.', '_' and '-'`)}},
	{"fleet empty", up + "store: {type: redis, addrs: [r:6379], fleet: \"\"}\n", []wantErr{at(2, `fleet "" may only have`)}},
	{"fleet colon", up + "store: {type: redis, addrs: [r:6379], fleet: \"a:b\"}\n", []wantErr{at(2, `fleet "a:b" may only have`)}},
	{"fleet long", up + "store: {type: redis, addrs: [r:6379], fleet: " + strings.Repeat("f", 65) + "}\n", []wantErr{at(2, "fleet is longer than 64 characters")}},
	{"fleet list", up + "store: {type: redis, addrs: [r:6379], fleet: [api]}\n", []wantErr{at(2, "fleet")}},
	{"fleet on memory", up + "store:\n  fleet: api\n", []wantErr{at(3, "fleet has no meaning for the memory store (is type: redis missing?)")}},
	{"admin token unset", up + "admin: {token_env: NOT_SET_ANYWHERE}\n", []wantErr{at(2, "missing admin token: the environment variable NOT_SET_ANYWHERE")}},
	{"admin metrics_listen clash", up + "admin_listen: 127.0.0.1:9090\nadmin: {metrics_listen: 127.0.0.1:9090}\n", []wantErr{at(3, `metrics_listen "127.0.0.1:9090" is also another listener's`)}},
	{"admin unknown field", up + "admin: {token: abc}\n", []wantErr{at(2, "token")}},
	{"admin tls without certificate", up + "admin:\n  tls: {client_ca_file: ca.pem}\n", []wantErr{at(3, "admin.tls", "cert_file and key_file are required")}},
	{"admin tls missing CA", up + "admin:\n  tls:\n    cert_file: $DIR/cert.pem\n    key_file: $DIR/key.pem\n    client_ca_file: $DIR/nowhere.pem\n", []wantErr{at(6, `client_ca_file`, "cannot be read")}},
	{"admin tls CA not a certificate", up + "admin:\n  tls: {cert_file: $DIR/cert.pem, key_file: $DIR/key.pem, client_ca_file: $DIR/key.pem}\n", []wantErr{at(3, `client_ca_file`, "holds no PEM certificate")}},
	{"proxy tls takes no client CA", up + "tls: {cert_file: $DIR/cert.pem, key_file: $DIR/key.pem, client_ca_file: $DIR/cert.pem}\n", []wantErr{at(2, `unknown field "client_ca_file"`)}},
	{"rls tls without key", up + "rls:\n  envoy_config: [$DIR/cert.pem]\n  tls: {cert_file: $DIR/cert.pem}\n", []wantErr{at(4, "rls.tls", "key_file is required with cert_file")}},
	{"rls tls CA not a certificate", up + "rls:\n  envoy_config: [$DIR/cert.pem]\n  tls: {cert_file: $DIR/cert.pem, key_file: $DIR/key.pem, client_ca_file: $DIR/key.pem}\n", []wantErr{at(4, "rls.tls", `client_ca_file`, "holds no PEM certificate")}},
	{"rls tls unknown field", up + "rls:\n  envoy_config: [$DIR/cert.pem]\n  tls: {cert: $DIR/cert.pem}\n", []wantErr{at(4, `unknown field "cert"`)}},
	{"tracing without endpoint", up + "tracing: {sample: 0.5}\n", []wantErr{at(2, "otlp_endpoint is required")}},
	{"tracing sample", up + "tracing: {otlp_endpoint: 127.0.0.1:4317, sample: 2}\n", []wantErr{at(2, "sample 2 must be from 0 to 1")}},
	{"tracing protocol", up + "tracing:\n  otlp_endpoint: 127.0.0.1:4318\n  otlp_protocol: http/json\n", []wantErr{at(4, `otlp_protocol "http/json" must be grpc (OTLP/gRPC, port 4317) or http/protobuf`)}},
	{"log format", up + "log: {format: xml}\n", []wantErr{at(2, `format "xml" must be text or json`)}},
	{"log level", up + "log:\n  level: loud\n", []wantErr{at(3, `level "loud" must be debug, info, warn or error`)}},
	{"log level offset", up + "log: {level: info+2}\n", []wantErr{at(2, `level "info+2" must be`)}},
	{"log unknown field", up + "log: {formt: json}\n", []wantErr{at(2, "formt")}},
	{"max_keys negative", up + "store: {max_keys: -1}\n", []wantErr{at(2, "max_keys -1 must be from 0")}},

	// Server.
	{"server: body_timeout zero", up + "server:\n  body_timeout: 0s\n", []wantErr{at(3, "server: body_timeout 0s must be > 0")}},
	{"server: body_min_rate", up + "server: {body_min_rate: -1, drain_timeout: -1s}\n",
		[]wantErr{at(2, "server: body_min_rate -1 must be from 0"), at(2, "server: drain_timeout -1s must be ≥ 0")}},
	{"server: shutdown_delay", up + "server:\n  shutdown_delay: -5s\n", []wantErr{at(3, "server: shutdown_delay -5s must be ≥ 0")}},
	{"server: body_min_rate type", up + "server: {body_min_rate: 1KiB}\n", []wantErr{at(2, `body_min_rate "1KiB" must be an integer`)}},
	{"server: body_memory", up + "server: {body_memory: 1000}\n", []wantErr{at(2, "server: body_memory 1000 must be from 1048576 (1 MiB)")}},
	{"server: body_memory under a route's max_body", up + "routes:\n  - {path_prefix: /v1, usage: {format: openai, max_body: 4194304}}\nserver:\n  body_memory: 2097152\n",
		[]wantErr{at(5, "server: body_memory 2097152 is less than the usage.max_body 4194304 of the route at line 3")}},
	{"server: unknown", up + "server: {body_timout: 1s}\n", []wantErr{at(2, `server: unknown field "body_timout"`, `did you mean "body_timeout"`)}},

	// Routes.
	{"path_prefix without /", up + "routes:\n  - {method: POST, path_prefix: reports, cost: 5}\n", []wantErr{at(3, `routes[0] "POST reports": path_prefix "reports" must start with /`)}},
	{"path_prefix missing", up + "routes:\n  - {cost: 5}\n", []wantErr{at(3, "routes[0]: path_prefix is required")}},
	{"cost negative", up + "routes:\n  - {path_prefix: /a, cost: -1}\n", []wantErr{at(3, "cost -1 must be ≥ 0")}},
	{"cost never fits", up + "policies: [{name: tiny, algorithm: fixed-window, limit: 3, period: 1s}]\ndefault_policy: tiny\nroutes:\n  - {path_prefix: /a, cost: 5}\n",
		[]wantErr{at(5, `routes[0] "/a": cost 5 exceeds the limit 3 of policy "tiny", so it can never be approved`)}},
	{"scope is a policy name", up + "policies: [{name: a, algorithm: fixed-window, limit: 3, period: 1s}]\nroutes:\n  - {path_prefix: /a, scope: a}\n",
		[]wantErr{at(4, `scope "a" is also a policy's name`)}},
	{"scope shared with other policies", up + "policies:\n  - {name: a, algorithm: fixed-window, limit: 3, period: 1s}\nroutes:\n  - {path_prefix: /a, scope: s, policy: a}\n  - {path_prefix: /b, scope: s}\n",
		[]wantErr{at(6, `scope "s" is also the scope of the route at line 5`)}},
	{"method", up + "routes:\n  - {method: \"GET /\", path_prefix: /}\n", []wantErr{at(3, `method "GET /" is not an HTTP method`)}},

	// Identity.
	{"identity: two sources in one item", up + "identity:\n  - api_key: {}\n    ip: {}\n", []wantErr{at(4, "has both api_key and ip")}},
	{"identity: empty item", up + "identity:\n  - {}\n", []wantErr{at(3, "names no source")}},
	{"identity: empty list", up + "identity: []\n", []wantErr{at(2, "identity is an empty list")}},
	{"identity: unreachable", up + "identity:\n  - ip: {}\n  - api_key: {}\n", []wantErr{at(4, "api_key is never reached: the ip source at line 3")}},
	{"ip: forwarded_header", up + "identity:\n  - ip: {forwarded_header: X-Real-IP}\n", []wantErr{at(3, `forwarded_header "X-Real-IP" must be X-Forwarded-For or Forwarded`)}},
	{"ip: forwarded_header list", up + "identity:\n  - ip: {forwarded_header: [X-Forwarded-For, Forwarded]}\n", []wantErr{at(3, `forwarded_header must be a string`)}},
	{"public key: ed25519 for ES256", up + "identity:\n  - jwt: {algorithms: [ES256], public_key_file: $DIR/ed25519.pem}\n",
		[]wantErr{at(3, "holds an Ed25519 key, which cannot verify ES256")}},
	{"identity: header", up + "identity:\n  - api_key: {header: \"X Key\"}\n", []wantErr{at(3, `header "X Key" is not a header name`)}},

	// Top level.
	{"upstream missing", "listen: 127.0.0.1:8080\n", []wantErr{at(1, "upstream is required")}},
	{"upstream scheme", "upstream: 127.0.0.1:9000\n", []wantErr{at(1, `upstream "127.0.0.1:9000" must be an http:// or https:// URL`)}},
	{"upstream user", "upstream: http://u:p@h\n", []wantErr{at(1, "upstream must not contain a user or password")}},
	{"listen", up + "listen: 8080\n", []wantErr{at(2, `listen "8080" is not host:port`)}},
	{"listen port", up + "listen: 127.0.0.1:99999\n", []wantErr{at(2, `port "99999" must be a number from 0 to 65535`)}},
	{"admin same as listen", up + "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8080\n", []wantErr{at(3, "admin_listen \"127.0.0.1:8080\" is also listen")}},
	{"tls half", up + "tls:\n  cert_file: $DIR/cert.pem\n", []wantErr{at(3, "tls: key_file is required with cert_file")}},
	{"tls missing file", up + "tls:\n  cert_file: $DIR/cert.pem\n  key_file: $DIR/nokey.pem\n", []wantErr{at(4, `key_file "`, `nokey.pem" cannot be read: no such file or directory`)}},
	{"tls mismatch", up + "tls: {cert_file: $DIR/cert.pem, key_file: $DIR/cert.pem}\n", []wantErr{at(2, "are not a PEM certificate and its private key")}},

	// Several at once: all reported, sorted by line, though found in another order.
	{"several", `listen: nowhere
upstream: http://127.0.0.1:9000
store:
  type: redis
identity:
  - ip: {trusted_proxies: [10.0.0.0/33]}
policies:
  - {name: gold, algorithm: token-bucket, limit: 10, period: 1m, burst: -5}
  - {name: silver, algorithm: leaky-bucket, limit: abc, period: 1m}
default_policy: platinum
clients:
  - {name: p, api_key_sha256: ` + hashA + `, policy: gold, extra: 1}
routes:
  - {path_prefix: reports}
limits: {max_delay: 10}
`, []wantErr{
		at(1, "listen"), at(4, "redis store needs addrs"), at(6, "10.0.0.0/33"), at(8, "burst -5 must be ≥ 0"),
		at(9, `limit "abc"`), at(10, `"platinum" is not defined`), at(12, "api_key_sha256 is never matched"), at(12, `unknown field "extra"`), at(14, "must start with /"),
		at(15, "max_delay 10 has no unit"),
	}},
}

func TestErrors(t *testing.T) {
	t.Parallel()
	for _, c := range errorCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := parseTest(t, c.yaml)
			if err == nil {
				t.Fatalf("no error; config %v", cfg)
			}
			if cfg != nil {
				t.Error("a Config with the error")
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("%T is not Errors: %v", err, err)
			}
			if len(errs) != len(c.want) {
				t.Fatalf("%d errors, want %d:\n%v", len(errs), len(c.want), err)
			}
			for i, w := range c.want {
				e := errs[i]
				if e.Line != w.line || e.File != "config.yaml" {
					t.Errorf("error %d at %s line %d, want line %d: %v", i, e.File, e.Line, w.line, e)
				}
				for _, word := range w.words {
					if !strings.Contains(e.Error(), word) {
						t.Errorf("error %d %q lacks %q", i, e, word)
					}
				}
				if prefix := fmt.Sprintf("config.yaml:%d:", w.line); !strings.HasPrefix(e.Error(), prefix) {
					t.Errorf("error %d %q does not start %q", i, e, prefix)
				}
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != len(errs) {
				t.Errorf("the text has %d lines for %d errors", len(lines), len(errs))
			}
		})
	}
}

// TestErrorText pins the format: file:line:column: path: message.
func TestErrorText(t *testing.T) {
	y := up + "policies:\n  - name: gold\n    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    burst: -5\n"
	_, err := parseTest(t, y)
	const want = `config.yaml:7:12: policies[0] "gold": burst -5 must be ≥ 0`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	if !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Error("errors.Is(err, sluice.ErrInvalidPolicy) is false")
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 7 || e.Column != 12 || e.Path != `policies[0] "gold"` || e.Msg != "burst -5 must be ≥ 0" {
		t.Errorf("%#v", e)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml: cannot read") {
		t.Errorf("missing file: %v", err)
	}
	// Files named in the configuration are relative to its directory.
	keys := fixtures(t)
	for _, f := range []string{"cert.pem", "key.pem"} {
		b, err := os.ReadFile(filepath.Join(keys, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(up+"tls: {cert_file: cert.pem, key_file: key.pem}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.File != path || cfg.TLS.CertFile != filepath.Join(dir, "cert.pem") {
		t.Errorf("file %q, tls %+v", cfg.File, cfg.TLS)
	}
	if err := os.WriteFile(path, []byte(up+"limits: {max_delay: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.HasPrefix(err.Error(), path+":2:") {
		t.Errorf("error %v does not start with %s:2:", err, path)
	}
}
