package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// envOf is a lookup over KEY=VALUE pairs, for planRatelimit.
func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// configMapDir lays out a directory as Kubernetes mounts a ConfigMap's files: each file a link
// to ..data/NAME, ..data a link to the directory of this version (..v1, ..v2, …). It returns the
// directory and a function that, as the kubelet does at an update, writes the next version and
// swaps ..data to it in one rename.
func configMapDir(t *testing.T, dir string, files map[string]string) (swap func(map[string]string)) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	version := 0
	swap = func(files map[string]string) {
		version++
		v := "..v" + string(rune('0'+version))
		if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(dir, v, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
				if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(v, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap(files)
	return swap
}

// Istio's sample environment, on a ConfigMap directory: the configuration the reference's
// variables make, exactly, and one that config.Parse takes.
func TestRatelimitPlanIstio(t *testing.T) {
	root := t.TempDir()
	configMapDir(t, filepath.Join(root, "ratelimit", "config"), map[string]string{"config.yaml": "domain: d\n"})
	p, err := planRatelimit(envOf(istioEnv("redis:6379", root)...))
	if err != nil {
		t.Fatal(err)
	}
	want := `listen: ""
admin_listen: ""
store:
    type: redis
    addrs:
        - redis:6379
    refusal_cache: 0
rls:
    listen: '[::]:8081'
    envoy_config:
        - ` + filepath.Join(root, "ratelimit", "config", "config.yaml") + `
log:
    format: text
    level: debug
`
	if p.yaml != want {
		t.Errorf("configuration:\n%s\nwant:\n%s", p.yaml, want)
	}
	if p.health != "[::]:8080" || p.metrics != "" || len(p.secrets) != 0 || len(p.unsupported) != 0 || !p.dots || p.xds {
		t.Errorf("plan %+v", p)
	}
	cfg, err := config.Parse([]byte(p.yaml), ratelimitSource)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "" || cfg.AdminListen != "" || cfg.Store.Type != config.StoreRedis || cfg.Store.RefusalCache != 0 || cfg.RLS.Listen != "[::]:8081" {
		t.Errorf("parsed: %v", cfg)
	}
}

// Envoy Gateway's environment (its rate limit Deployment's): rules over xDS with mTLS, the rate
// limit service over mTLS, Prometheus, tracing. rls.xds is generated as the xDS client reads it.
func TestRatelimitPlanEnvoyGateway(t *testing.T) {
	p, err := planRatelimit(envOf(
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"CONFIG_GRPC_XDS_NODE_METADATA=zone=a,bad,k2=v=2",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key",
		"GRPC_CLIENT_TLS_CACERT=/certs/ca.crt", "CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis.redis-system.svc.cluster.local:6379",
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
		"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=envoy-ratelimit", "TRACING_SERVICE_NAMESPACE=envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID=envoy-ratelimit-abc", "TRACING_SAMPLING_RATE=0.5",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.monitoring:4318",
	))
	if err != nil {
		t.Fatal(err)
	}
	want := `listen: ""
admin_listen: ""
store:
    type: redis
    addrs:
        - redis.redis-system.svc.cluster.local:6379
    refusal_cache: 0
rls:
    listen: 0.0.0.0:8081
    tls:
        cert_file: /certs/tls.crt
        key_file: /certs/tls.key
        client_ca_file: /certs/ca.crt
    xds:
        server: envoy-gateway:18001
        node_id: envoy-ratelimit
        node_metadata:
            k2: v=2
            zone: a
        tls:
            ca_file: /certs/ca.crt
            cert_file: /certs/tls.crt
            key_file: /certs/tls.key
        connect_retry:
            initial: 3s
            max: 60s
log:
    format: text
    level: info
tracing:
    otlp_endpoint: otel-collector.monitoring:4318
    otlp_protocol: http/protobuf
    sample: 0.5
    service_name: envoy-ratelimit
`
	if p.yaml != want {
		t.Errorf("configuration:\n%s\nwant:\n%s", p.yaml, want)
	}
	if p.metrics != ":19001" || p.path != "/metrics" || !p.xds || p.health != "0.0.0.0:8080" {
		t.Errorf("plan %+v", p)
	}
	if want := []string{"PROMETHEUS_MAPPER_YAML", "TRACING_SERVICE_INSTANCE_ID", "TRACING_SERVICE_NAMESPACE"}; !slices.Equal(p.unsupported, want) {
		t.Errorf("unsupported %v, want %v", p.unsupported, want)
	}
}

// The store of each REDIS_TYPE and URL form; the password never in the configuration's text.
func TestRatelimitPlanRedis(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   []string
		store string // the store section's text
		env2  map[string]string
	}{
		{"single", []string{"REDIS_URL=r:6379"}, "    addrs:\n        - r:6379\n", nil},
		{"single URL with a database", []string{"REDIS_URL=redis://r:6379/2"}, "    url: redis://r:6379/2\n", nil},
		{"TLS", []string{"REDIS_URL=r:6380", "REDIS_TLS=true"}, "    url: rediss://r:6380\n", nil},
		{"password", []string{"REDIS_URL=r:6379", "REDIS_AUTH=s3cret"},
			"    addrs:\n        - r:6379\n    password_env: " + envRedisPassword + "\n", map[string]string{envRedisPassword: "s3cret"}},
		{"user and password", []string{"REDIS_URL=r:6379", "REDIS_AUTH=rl:pa:ss"},
			"    addrs:\n        - r:6379\n    username: rl\n    password_env: " + envRedisPassword + "\n", map[string]string{envRedisPassword: "pa:ss"}},
		{"cluster", []string{"REDIS_TYPE=CLUSTER", "REDIS_URL=a:7000,b:7001"}, "    addrs:\n        - a:7000\n        - b:7001\n", nil},
		{"sentinel", []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH=sp", "REDIS_AUTH=rp"},
			"    password_env: " + envRedisPassword + "\n    refusal_cache: 0\n    sentinel:\n        master: mymaster\n        addrs:\n            - s1:26379\n            - s2:26379\n        password_env: " + envSentinelPassword + "\n",
			map[string]string{envRedisPassword: "rp", envSentinelPassword: "sp"}},
		{"key prefix and local cache", []string{"REDIS_URL=r:6379", "CACHE_KEY_PREFIX=team-a", "LOCAL_CACHE_SIZE_IN_BYTES=1048576"},
			"    addrs:\n        - r:6379\n    prefix: team-a\n    refusal_cache: 65536\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: d\n"), 0o644)
			p, err := planRatelimit(envOf(append([]string{"REDIS_SOCKET_TYPE=tcp", "RUNTIME_ROOT=" + dir, "RUNTIME_APPDIRECTORY=."}, c.env...)...))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(p.yaml, "store:\n    type: redis\n"+c.store) {
				t.Errorf("configuration:\n%s\nwant its store to hold:\n%s", p.yaml, c.store)
			}
			for _, s := range []string{"s3cret", "pa:ss", "sp\n", "rp\n"} {
				if strings.Contains(p.yaml, s) {
					t.Errorf("the configuration holds the password %q:\n%s", s, p.yaml)
				}
			}
			if !maps.Equal(p.secrets, c.env2) {
				t.Errorf("secrets %v, want %v", p.secrets, c.env2)
			}
			for k, v := range p.secrets {
				t.Setenv(k, v)
			}
			if _, err := config.Parse([]byte(p.yaml), ratelimitSource); err != nil {
				t.Errorf("config.Parse: %v\n%s", err, p.yaml)
			}
		})
	}
}

// A bad value, or one asking for what sluice cannot do, is an error naming its variable; every
// such variable is named at once.
func TestRatelimitPlanErrors(t *testing.T) {
	ok := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "RUNTIME_ROOT=/nowhere"}
	for _, c := range []struct {
		env  []string
		want []string
	}{
		{[]string{"GRPC_PORT=http"}, []string{`GRPC_PORT "http" must be a port number`}},
		{[]string{"PORT=70000"}, []string{`PORT "70000" must be a port number`}},
		{[]string{"GRPC_UDS=/tmp/rl.sock"}, []string{"GRPC_UDS", "TCP only"}},
		{[]string{"GRPC_SERVER_USE_TLS=yes please"}, []string{`GRPC_SERVER_USE_TLS "yes please" must be true or false`}},
		{[]string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c"}, []string{"GRPC_SERVER_TLS_KEY"}},
		{[]string{"GRPC_CLIENT_TLS_SAN=spiffe://x"}, []string{"GRPC_CLIENT_TLS_SAN"}},
		{[]string{"LOG_LEVEL=loud"}, []string{`LOG_LEVEL "loud"`}},
		{[]string{"LOG_FORMAT=xml"}, []string{`LOG_FORMAT "xml" must be text or json`}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_DELTA"}, []string{`CONFIG_TYPE "GRPC_XDS_DELTA" must be FILE or GRPC_XDS_SOTW`}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=eg"}, []string{"CONFIG_GRPC_XDS_SERVER_URL", "not host:port"}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=3"}, []string{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "duration"}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/c"}, []string{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"}},
		{[]string{"SHADOW_MODE=true"}, []string{"SHADOW_MODE=true"}},
		{[]string{"QUOTA_MODE=true"}, []string{"QUOTA_MODE=true"}},
		{[]string{"BACKEND_TYPE=memcache"}, []string{`BACKEND_TYPE "memcache"`, "Redis only"}},
		{[]string{"LOCAL_CACHE_SIZE_IN_BYTES=lots"}, []string{"LOCAL_CACHE_SIZE_IN_BYTES"}},
		{[]string{"REDIS_SOCKET_TYPE=unix"}, []string{`REDIS_SOCKET_TYPE "unix"`, "TCP only"}},
		{[]string{"REDIS_URL="}, []string{"REDIS_URL is required"}},
		{[]string{"REDIS_URL=r"}, []string{"REDIS_URL", `"r" is not host:port`}},
		{[]string{"REDIS_URL=redis://u:pw@r:6379"}, []string{"REDIS_URL", "REDIS_AUTH"}},
		{[]string{"REDIS_URL=a:1,b:2"}, []string{"REDIS_URL", "single takes one host:port"}},
		{[]string{"REDIS_TYPE=cluster"}, []string{"REDIS_URL", "at least two"}},
		{[]string{"REDIS_TYPE=sentinel"}, []string{"REDIS_URL", "master,host:port"}},
		{[]string{"REDIS_TYPE=replica"}, []string{`REDIS_TYPE "replica" must be single, sentinel or cluster`}},
		{[]string{"REDIS_TYPE=cluster", "REDIS_URL=a:1,b:2", "REDIS_TLS=true"}, []string{"REDIS_TLS=true", "single Redis server only"}},
		{[]string{"USE_PROMETHEUS=true", "PROMETHEUS_PATH=metrics"}, []string{`PROMETHEUS_PATH "metrics" must start with /`}},
		{[]string{"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=zipkin"}, []string{"TRACING_EXPORTER_PROTOCOL"}},
		{[]string{"TRACING_ENABLED=true", "TRACING_SAMPLING_RATE=2"}, []string{"TRACING_SAMPLING_RATE"}},
		{[]string{"TRACING_ENABLED=true", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=https://c:4318"}, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "plaintext"}},
		{[]string{"GRPC_PORT=x", "LOG_FORMAT=xml"}, []string{"GRPC_PORT", "LOG_FORMAT"}},
	} {
		t.Run(strings.Join(c.env, " "), func(t *testing.T) {
			p, err := planRatelimit(envOf(append(slices.Clone(ok), c.env...)...))
			if err == nil {
				t.Fatalf("no error; configuration:\n%s", p.yaml)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The configuration directory missing, or holding no file, is an error that names it.
func TestRatelimitPlanNoFiles(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ratelimit", "config", "..hidden"), 0o755)
	os.WriteFile(filepath.Join(root, "ratelimit", "config", "..hidden", "a.yaml"), []byte("domain: d\n"), 0o644)
	for _, env := range [][]string{{"RUNTIME_ROOT=" + filepath.Join(root, "nowhere")}, {"RUNTIME_ROOT=" + root, "RUNTIME_IGNOREDOTFILES=true"}} {
		_, err := planRatelimit(envOf(append(env, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "RUNTIME_SUBDIRECTORY=ratelimit")...))
		if err == nil || !strings.Contains(err.Error(), "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY") {
			t.Errorf("%v: error %v", env, err)
		}
	}
}

// The variables sluice does not act on are named, once each, when set to anything that asks for
// something; those set to what asks for nothing (USE_STATSD=false) are not.
func TestRatelimitPlanUnsupported(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "a.yaml"), []byte("domain: d\n"), 0o644)
	p, err := planRatelimit(envOf("REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6379", "RUNTIME_ROOT="+root, "RUNTIME_APPDIRECTORY=.",
		"USE_STATSD=false", "DEBUG_PORT=6070", "REDIS_POOL_SIZE=20", "MEMCACHE_TLS=false", "REDIS_PERSECOND=true",
		"NEAR_LIMIT_RATIO=", "STATSD_HOST=statsd", "REDIS_TLS_CACERT=/ca.pem", "SHADOW_MODE=false"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"DEBUG_PORT", "REDIS_PERSECOND", "REDIS_POOL_SIZE", "REDIS_TLS_CACERT", "STATSD_HOST"}; !slices.Equal(p.unsupported, want) {
		t.Errorf("unsupported %v, want %v", p.unsupported, want)
	}
}

// The configuration files of a ConfigMap's directory: with RUNTIME_IGNOREDOTFILES, its files
// (links into ..data) only; without, the version's copies as well, as the reference reads them.
func TestEnvoyFilesConfigMap(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	configMapDir(t, dir, map[string]string{"a.yaml": "domain: a\n", "b.yaml": "domain: b\n"})
	os.Mkdir(filepath.Join(dir, "team"), 0o755)
	os.WriteFile(filepath.Join(dir, "team", "c.yaml"), []byte("domain: c\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".d.yaml"), []byte("domain: d\n"), 0o644)
	files, err := envoyFiles(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "team", "c.yaml")}; !slices.Equal(files, want) {
		t.Errorf("files %v, want %v", files, want)
	}
	files, err = envoyFiles(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "..v1", "a.yaml"), filepath.Join(dir, "..v1", "b.yaml"), filepath.Join(dir, ".d.yaml"),
		filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "team", "c.yaml")}; !slices.Equal(files, want) {
		t.Errorf("files %v, want %v", files, want)
	}
}

// sluice called ratelimit runs `sluice ratelimit`; called anything else, its arguments.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct{ argv, want []string }{
		{[]string{"/bin/ratelimit"}, []string{"ratelimit"}},
		{[]string{"ratelimit", "--help"}, []string{"ratelimit", "--help"}},
		{[]string{"/usr/bin/sluice", "serve"}, []string{"serve"}},
		{[]string{"/bin/ratelimit-old"}, []string{}},
	} {
		if got := commandLine(c.argv); !slices.Equal(got, c.want) {
			t.Errorf("commandLine(%q) = %q, want %q", c.argv, got, c.want)
		}
	}
}
