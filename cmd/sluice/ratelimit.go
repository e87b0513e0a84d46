package main

// sluice as envoyproxy/ratelimit's drop-in: started as /bin/ratelimit (or `sluice ratelimit`), it
// reads the reference's environment variables, turns them into a sluice configuration (YAML text,
// parsed by config.Parse like any file, so that every check applies) and runs the rate limit
// service alone: the gRPC service, the reference's HTTP /healthcheck and /json, and /metrics if
// asked.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
)

// The variables sluice sets in its own environment for the Redis passwords, which the generated
// configuration names by password_env: the text, which a log or an error may show, holds none.
const (
	envRedisPassword    = "SLUICE_RATELIMIT_REDIS_PASSWORD"
	envSentinelPassword = "SLUICE_RATELIMIT_SENTINEL_PASSWORD"
)

// ratelimitName is the name (argv[0]'s base) under which sluice behaves as envoyproxy/ratelimit.
const ratelimitName = "ratelimit"

// ratelimitSource is the name the generated configuration's errors carry.
const ratelimitSource = "envoyproxy/ratelimit environment"

func newRatelimitCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ratelimit",
		Short: "run Envoy's rate limit service configured as envoyproxy/ratelimit is: by its environment variables",
		Long: `Run the rate limit service the way envoyproxy/ratelimit runs: configured by its environment
variables (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, REDIS_URL, GRPC_PORT, PORT,
USE_PROMETHEUS, LOG_LEVEL, CONFIG_TYPE, ...), not by a sluice configuration file. sluice started
as /bin/ratelimit (its image has that name) does the same, so that sluice's image replaces the
reference's where Istio's sample or Envoy Gateway starts it.

It serves Envoy's rate limit service on GRPC_HOST:GRPC_PORT (0.0.0.0:8081; TLS with
GRPC_SERVER_USE_TLS), GET /healthcheck (200 "OK", or 500) and POST /json on HOST:PORT
(0.0.0.0:8080), and with USE_PROMETHEUS=true sluice's metrics on PROMETHEUS_ADDR (:9090) at
PROMETHEUS_PATH (/metrics).
The configuration files under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY are read
again whenever one changes (a Kubernetes ConfigMap's update included); an invalid change is
logged and the running files stay. Variables sluice does not support are named in one warning at
start; a bad value exits with code 2, naming the variable. Every variable, and what sluice does
with it: docs/envoy.md, "The reference's environment (/bin/ratelimit)".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return ratelimit(cmd.Context(), os.LookupEnv, cmd.ErrOrStderr())
		},
	}
}

// ratelimitPlan is what the reference's environment says: the sluice configuration (YAML, no
// secret in it), the secrets it names, and what runs beside the rate limit service.
type ratelimitPlan struct {
	yaml    string
	secrets map[string]string // variable → value, to set in this process before parsing yaml
	health  string            // HOST:PORT, /healthcheck
	metrics string            // PROMETHEUS_ADDR, "" for none
	path    string            // PROMETHEUS_PATH
	dir     string            // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
	dots    bool              // RUNTIME_IGNOREDOTFILES: skip files and directories named .*
	xds     bool              // CONFIG_TYPE=GRPC_XDS_SOTW: the rules come over xDS, not from dir
	// activeRedis (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION): /healthcheck follows the store, not only
	// until it first answered; oneConfig (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED): unhealthy
	// until a configuration has loaded.
	activeRedis, oneConfig bool
	unsupported            []string // the variables set that sluice does not support, sorted
}

// The generated configuration, in the order docs/config.md lists its fields.
type (
	rlConfig struct {
		Listen      string     `yaml:"listen"`
		AdminListen string     `yaml:"admin_listen"`
		Store       rlStore    `yaml:"store"`
		RLS         rlRLS      `yaml:"rls"`
		Log         rlLog      `yaml:"log"`
		Tracing     *rlTracing `yaml:"tracing,omitempty"`
	}
	rlStore struct {
		Type         string      `yaml:"type"`
		Addrs        []string    `yaml:"addrs,omitempty"`
		URL          string      `yaml:"url,omitempty"`
		Username     string      `yaml:"username,omitempty"`
		PasswordEnv  string      `yaml:"password_env,omitempty"`
		Prefix       string      `yaml:"prefix,omitempty"`
		RefusalCache int         `yaml:"refusal_cache"`
		Sentinel     *rlSentinel `yaml:"sentinel,omitempty"`
	}
	rlSentinel struct {
		Master      string   `yaml:"master"`
		Addrs       []string `yaml:"addrs"`
		PasswordEnv string   `yaml:"password_env,omitempty"`
	}
	rlRLS struct {
		Listen      string   `yaml:"listen"`
		EnvoyConfig []string `yaml:"envoy_config,omitempty"`
		TLS         *rlTLS   `yaml:"tls,omitempty"`
		XDS         *rlXDS   `yaml:"xds,omitempty"`
	}
	rlTLS struct {
		CertFile     string `yaml:"cert_file"`
		KeyFile      string `yaml:"key_file"`
		ClientCAFile string `yaml:"client_ca_file,omitempty"`
	}
	rlXDS struct {
		Server       string            `yaml:"server"`
		NodeID       string            `yaml:"node_id"`
		NodeMetadata map[string]string `yaml:"node_metadata,omitempty"`
		TLS          *rlXDSTLS         `yaml:"tls,omitempty"`
		ConnectRetry rlRetry           `yaml:"connect_retry"`
	}
	rlXDSTLS struct {
		CA         string `yaml:"ca_file,omitempty"`
		Cert       string `yaml:"cert_file,omitempty"`
		Key        string `yaml:"key_file,omitempty"`
		ServerName string `yaml:"server_name,omitempty"`
	}
	rlRetry struct {
		Initial string `yaml:"initial"`
		Max     string `yaml:"max"`
	}
	rlLog struct {
		Format string `yaml:"format"`
		Level  string `yaml:"level"`
	}
	rlTracing struct {
		Endpoint    string  `yaml:"otlp_endpoint"`
		Protocol    string  `yaml:"otlp_protocol"`
		Sample      float64 `yaml:"sample"`
		ServiceName string  `yaml:"service_name"`
	}
)

// unsupported are the reference's variables sluice does not act on, each with the value that
// asks for nothing it would miss ("" for none): a variable set to another value is named in the
// start's warning. The names are the reference's (src/settings/settings.go).
var unsupported = map[string]string{
	"DEBUG_HOST": "", "DEBUG_PORT": "",
	"GRPC_MAX_CONNECTION_AGE": "", "GRPC_MAX_CONNECTION_AGE_GRACE": "",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":       "", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "", "XDS_CLIENT_BACKOFF_JITTER": "",
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "",
	"USE_DOG_STATSD":                   "false", "USE_DOG_STATSD_MOGRIFIERS": "", "USE_STATSD": "false",
	"STATSD_HOST": "", "STATSD_PORT": "", "EXTRA_TAGS": "", "STATS_FLUSH_INTERVAL": "",
	"PROMETHEUS_MAPPER_YAML": "", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "false",
	"EXPIRATION_JITTER_MAX_SECONDS": "", "NEAR_LIMIT_RATIO": "",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false",
	"LIMIT_RESPONSE_HEADERS_ENABLED":          "false", "LIMIT_LIMIT_HEADER": "", "LIMIT_REMAINING_HEADER": "", "LIMIT_RESET_HEADER": "",
	"REDIS_POOL_SIZE": "", "REDIS_TLS_CLIENT_CERT": "", "REDIS_TLS_CLIENT_KEY": "", "REDIS_TLS_CACERT": "",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "false",
	"REDIS_PIPELINE_WINDOW":                "", "REDIS_PIPELINE_LIMIT": "", "REDIS_CLUSTER_PIPELINE_PARALLELISM": "",
	"REDIS_PERSECOND": "false", "REDIS_PERSECOND_SOCKET_TYPE": "", "REDIS_PERSECOND_TYPE": "", "REDIS_PERSECOND_URL": "",
	"REDIS_PERSECOND_POOL_SIZE": "", "REDIS_PERSECOND_AUTH": "", "REDIS_PERSECOND_TLS": "false",
	"REDIS_PERSECOND_SENTINEL_AUTH": "", "REDIS_PERSECOND_PIPELINE_WINDOW": "", "REDIS_PERSECOND_PIPELINE_LIMIT": "",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "", "REDIS_PERSECOND_TIMEOUT": "",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "", "REDIS_TIMEOUT": "", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "",
	"REDIS_STARTUP_INITIAL_INTERVAL": "", "REDIS_STARTUP_MAX_INTERVAL": "", "REDIS_STARTUP_MAX_ELAPSED_TIME": "",
	"MEMCACHE_HOST_PORT": "", "MEMCACHE_MAX_IDLE_CONNS": "", "MEMCACHE_SRV": "", "MEMCACHE_SRV_REFRESH": "",
	"MEMCACHE_TLS": "false", "MEMCACHE_TLS_CLIENT_CERT": "", "MEMCACHE_TLS_CLIENT_KEY": "", "MEMCACHE_TLS_CACERT": "",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": "false",
	"RESPONSE_DYNAMIC_METADATA":               "false", "MERGE_DOMAIN_CONFIG": "false",
	"TRACING_SERVICE_NAMESPACE": "", "TRACING_SERVICE_INSTANCE_ID": "",
}

// envReader reads the reference's variables as its envconfig does (a variable set but empty
// counts as not set), gathering every bad value, each naming its variable.
type envReader struct {
	lookup func(string) (string, bool)
	errs   []error
}

func (e *envReader) str(name, def string) string {
	if v, ok := e.lookup(name); ok && v != "" {
		return v
	}
	return def
}

func (e *envReader) set(name string) bool { return e.str(name, "") != "" }

func (e *envReader) errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Errorf(format, args...))
}

func (e *envReader) bool(name string, def bool) bool {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errorf("%s %q must be true or false", name, v)
		return def
	}
	return b
}

func (e *envReader) port(name string, def int) string {
	v := e.str(name, strconv.Itoa(def))
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 65535 {
		e.errorf("%s %q must be a port number (0 to 65535)", name, v)
	}
	return v
}

func (e *envReader) duration(name, def string) string {
	v := e.str(name, def)
	if d, err := time.ParseDuration(v); err != nil || d <= 0 {
		e.errorf("%s %q must be a duration > 0 (e.g. 3s, 1m)", name, v)
		return def
	}
	return v
}

// hostPort checks a host:port of name's value (a part of it: field) and returns it.
func (e *envReader) hostPort(name, field, v string) string {
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		e.errorf("%s: %q is not host:port", name, field)
	}
	return v
}

// planRatelimit reads the reference's environment (lookup: os.LookupEnv) into a plan. Its error
// names every variable with a bad value, or that asks for what sluice cannot do.
func planRatelimit(lookup func(string) (string, bool)) (*ratelimitPlan, error) {
	e := &envReader{lookup: lookup}
	p := &ratelimitPlan{secrets: map[string]string{}}
	var c rlConfig
	c.Listen, c.AdminListen = "", ""

	p.health = net.JoinHostPort(e.str("HOST", "0.0.0.0"), e.port("PORT", 8080))
	if e.set("GRPC_UDS") {
		e.errorf("GRPC_UDS %q: sluice serves the rate limit service on TCP only (GRPC_HOST:GRPC_PORT); unset it", e.str("GRPC_UDS", ""))
	}
	c.RLS.Listen = net.JoinHostPort(e.str("GRPC_HOST", "0.0.0.0"), e.port("GRPC_PORT", 8081))
	if e.bool("GRPC_SERVER_USE_TLS", false) {
		t := &rlTLS{CertFile: e.str("GRPC_SERVER_TLS_CERT", ""), KeyFile: e.str("GRPC_SERVER_TLS_KEY", ""), ClientCAFile: e.str("GRPC_CLIENT_TLS_CACERT", "")}
		if t.CertFile == "" || t.KeyFile == "" {
			e.errorf("GRPC_SERVER_USE_TLS=true wants GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (the server's PEM certificate and key files)")
		}
		c.RLS.TLS = t
	}
	if e.set("GRPC_CLIENT_TLS_SAN") {
		e.errorf("GRPC_CLIENT_TLS_SAN: sluice does not check a client certificate's SAN (every certificate GRPC_CLIENT_TLS_CACERT signed is let in); unset it")
	}

	switch level := strings.ToLower(e.str("LOG_LEVEL", "warn")); level {
	case "trace", "debug":
		c.Log.Level = "debug"
	case "info", "warn", "error":
		c.Log.Level = level
	case "warning":
		c.Log.Level = "warn"
	case "fatal", "panic":
		c.Log.Level = "error"
	default:
		e.errorf("LOG_LEVEL %q must be trace, debug, info, warn, error, fatal or panic", e.str("LOG_LEVEL", ""))
	}
	switch c.Log.Format = e.str("LOG_FORMAT", "text"); c.Log.Format {
	case "text", "json":
	default:
		e.errorf("LOG_FORMAT %q must be text or json", c.Log.Format)
	}

	switch t := e.str("CONFIG_TYPE", "FILE"); t {
	case "FILE":
		p.dir = filepath.Join(e.str("RUNTIME_ROOT", "/srv/runtime_data/current"), e.str("RUNTIME_SUBDIRECTORY", ""), e.str("RUNTIME_APPDIRECTORY", "config"))
	case "GRPC_XDS_SOTW":
		p.xds = true
		c.RLS.XDS = xdsConfig(e)
	default:
		e.errorf("CONFIG_TYPE %q must be FILE or GRPC_XDS_SOTW", t)
	}
	p.dots = e.bool("RUNTIME_IGNOREDOTFILES", false)
	e.bool("RUNTIME_WATCH_ROOT", true) // either way the files are watched; only its value is checked
	e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)
	p.oneConfig = e.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)
	p.activeRedis = e.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false)
	for _, name := range []string{"SHADOW_MODE", "QUOTA_MODE"} {
		if e.bool(name, false) {
			e.errorf("%s=true: sluice has no such mode (it would refuse what the reference lets through); unset it", name)
		}
	}

	c.Store = storeConfig(e, p)

	if e.bool("USE_PROMETHEUS", false) && !e.bool("DISABLE_STATS", false) {
		p.metrics = e.str("PROMETHEUS_ADDR", ":9090")
		e.hostPort("PROMETHEUS_ADDR", p.metrics, p.metrics)
		if p.path = e.str("PROMETHEUS_PATH", "/metrics"); !strings.HasPrefix(p.path, "/") {
			e.errorf("PROMETHEUS_PATH %q must start with /", p.path)
		}
	}
	c.Tracing = tracingConfig(e)

	for name, neutral := range unsupported {
		if v := e.str(name, ""); v != "" && v != neutral {
			p.unsupported = append(p.unsupported, name)
		}
	}
	sort.Strings(p.unsupported)
	if len(e.errs) > 0 {
		return nil, errors.Join(e.errs...)
	}
	if !p.xds {
		files, err := envoyFiles(p.dir, p.dots)
		if err != nil {
			return nil, err
		}
		c.RLS.EnvoyConfig = files
	}
	text, err := yaml.Marshal(&c)
	if err != nil {
		return nil, err
	}
	p.yaml = string(text)
	return p, nil
}

// storeConfig is the store of the REDIS_* variables: its password goes to p.secrets.
func storeConfig(e *envReader, p *ratelimitPlan) rlStore {
	s := rlStore{Type: "redis", Prefix: e.str("CACHE_KEY_PREFIX", "")}
	if b := e.str("BACKEND_TYPE", "redis"); b != "redis" {
		e.errorf("BACKEND_TYPE %q: sluice keeps its counters in Redis only (BACKEND_TYPE=redis)", b)
	}
	// The reference's cache of over-limit keys, in bytes (0: none) is sluice's cache of
	// refusals, in entries: on at its default size, or off.
	if v := e.str("LOCAL_CACHE_SIZE_IN_BYTES", "0"); v != "0" {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			e.errorf("LOCAL_CACHE_SIZE_IN_BYTES %q must be a number of bytes ≥ 0", v)
		} else {
			s.RefusalCache = config.DefaultRefusalCache
		}
	}
	if t := e.str("REDIS_SOCKET_TYPE", "unix"); t != "tcp" {
		e.errorf("REDIS_SOCKET_TYPE %q: sluice reaches Redis over TCP only: set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port", t)
		return s
	}
	raw := e.str("REDIS_URL", "")
	if raw == "" {
		e.errorf("REDIS_URL is required: the Redis server's host:port (REDIS_TYPE=sentinel: master,host:port,...; cluster: host:port,host:port,...)")
		return s
	}
	if auth := e.str("REDIS_AUTH", ""); auth != "" {
		user, pw, ok := strings.Cut(auth, ":")
		if !ok {
			user, pw = "", auth
		}
		s.Username, s.PasswordEnv = user, envRedisPassword
		p.secrets[envRedisPassword] = pw
	}
	useTLS := e.bool("REDIS_TLS", false)
	parts := strings.Split(raw, ",")
	switch t := strings.ToLower(e.str("REDIS_TYPE", "SINGLE")); t {
	case "single":
		if len(parts) > 1 {
			e.errorf("REDIS_URL: REDIS_TYPE single takes one host:port, not %d", len(parts))
			return s
		}
		if strings.HasPrefix(raw, "redis://") || strings.HasPrefix(raw, "rediss://") {
			u, err := url.Parse(raw)
			if err != nil || u.User != nil {
				e.errorf("REDIS_URL: a redis:// URL must be redis://host:port[/db], with the credentials in REDIS_AUTH")
				return s
			}
			if useTLS {
				u.Scheme = "rediss"
			}
			s.URL = u.String()
			return s
		}
		e.hostPort("REDIS_URL", raw, raw)
		if useTLS {
			s.URL = "rediss://" + raw
		} else {
			s.Addrs = []string{raw}
		}
	case "cluster":
		if len(parts) < 2 {
			e.errorf("REDIS_URL: with REDIS_TYPE cluster sluice needs at least two of the cluster's nodes (host:port,host:port), to know it is a cluster")
		}
		for _, a := range parts {
			s.Addrs = append(s.Addrs, e.hostPort("REDIS_URL", a, a))
		}
	case "sentinel":
		if len(parts) < 2 {
			e.errorf("REDIS_URL: REDIS_TYPE sentinel takes the master's name and the sentinels: master,host:port,...")
			return s
		}
		s.Sentinel = &rlSentinel{Master: parts[0]}
		for _, a := range parts[1:] {
			s.Sentinel.Addrs = append(s.Sentinel.Addrs, e.hostPort("REDIS_URL", a, a))
		}
		if pw := e.str("REDIS_SENTINEL_AUTH", ""); pw != "" {
			s.Sentinel.PasswordEnv = envSentinelPassword
			p.secrets[envSentinelPassword] = pw
		}
	default:
		e.errorf("REDIS_TYPE %q must be single, sentinel or cluster", e.str("REDIS_TYPE", ""))
	}
	if useTLS && s.URL == "" {
		e.errorf("REDIS_TLS=true: sluice speaks TLS to a single Redis server only (REDIS_TYPE single), not to a %s", strings.ToLower(e.str("REDIS_TYPE", "")))
	}
	return s
}

// xdsConfig is rls.xds of the CONFIG_GRPC_XDS_* variables, with the reference's defaults.
func xdsConfig(e *envReader) *rlXDS {
	x := &rlXDS{
		Server: e.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
		NodeID: e.str("CONFIG_GRPC_XDS_NODE_ID", "default"),
		ConnectRetry: rlRetry{Initial: e.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s"),
			Max: e.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")},
	}
	e.hostPort("CONFIG_GRPC_XDS_SERVER_URL", x.Server, x.Server)
	// "k=v,k2=v2", as the reference reads it: an entry without = is left out.
	for _, kv := range strings.Split(e.str("CONFIG_GRPC_XDS_NODE_METADATA", ""), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if x.NodeMetadata == nil {
				x.NodeMetadata = map[string]string{}
			}
			x.NodeMetadata[k] = v
		}
	}
	if e.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		x.TLS = &rlXDSTLS{CA: e.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""), Cert: e.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""),
			Key: e.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""), ServerName: e.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "")}
		if (x.TLS.Cert == "") != (x.TLS.Key == "") {
			e.errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together (the client's certificate and its key)")
		}
	}
	return x
}

// tracingConfig is the tracing of TRACING_* and the OTLP endpoint variables (nil: off).
func tracingConfig(e *envReader) *rlTracing {
	if !e.bool("TRACING_ENABLED", false) {
		return nil
	}
	t := &rlTracing{Protocol: "http/protobuf", ServiceName: e.str("TRACING_SERVICE_NAME", "RateLimit"), Sample: 1}
	def := "localhost:4318"
	switch p := strings.ToLower(e.str("TRACING_EXPORTER_PROTOCOL", "http")); p {
	case "http":
	case "grpc":
		t.Protocol, def = "grpc", "localhost:4317"
	default:
		e.errorf("TRACING_EXPORTER_PROTOCOL %q must be http or grpc", p)
	}
	v := e.str("TRACING_SAMPLING_RATE", "1")
	if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || f > 1 {
		e.errorf("TRACING_SAMPLING_RATE %q must be a number from 0 to 1", v)
	} else {
		t.Sample = f
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	if !e.set(name) {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
	}
	t.Endpoint = def
	if v := e.str(name, ""); v != "" {
		// A URL (http://collector:4318, the OTLP form) or host:port; sluice's exporter is plaintext
		// and POSTs to /v1/traces.
		hp := v
		if u, err := url.Parse(v); err == nil && u.Host != "" {
			if u.Scheme != "http" || (u.Path != "" && u.Path != "/" && u.Path != "/v1/traces") {
				e.errorf("%s %q: sluice exports spans over plaintext only, to http://host:port (/v1/traces)", name, v)
			}
			hp = u.Host
		}
		t.Endpoint = e.hostPort(name, v, hp)
	}
	return t
}

// envoyFiles lists the configuration files under dir, as the reference's runtime loader finds
// them: every file in dir and its subdirectories, through symbolic links to files (a
// ConfigMap's files are links into its ..data); with dots, a name starting with . is left out,
// and so is what is under it (the ConfigMap's ..data and ..2024_…, a second copy of its files).
func envoyFiles(dir string, dots bool) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		if dots && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY: no configuration file in %s", dir)
	}
	return files, nil
}

// filesStamp tells when the configuration files changed: their names, and each one's size and
// modification time through its links.
func filesStamp(files []string) string {
	var b strings.Builder
	for _, f := range files {
		s := statFile(f)
		fmt.Fprintf(&b, "%s %d %d\n", f, s.size, s.mod.UnixNano())
	}
	return b.String()
}

// ratelimit runs the rate limit service as the environment (lookup) says, until ctx is done or
// SIGTERM or SIGINT: the reference's own start, for sluice's image.
func ratelimit(ctx context.Context, lookup func(string) (string, bool), stderr io.Writer) error {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)
	p, err := planRatelimit(lookup)
	if err != nil {
		return configError{err}
	}
	for k, v := range p.secrets {
		if err := os.Setenv(k, v); err != nil {
			return failure{err}
		}
	}
	cfg, err := config.Parse([]byte(p.yaml), ratelimitSource)
	if err != nil {
		return configError{err}
	}
	level := new(slog.LevelVar)
	log := newLogger(cfg.Log, level, stderr)
	if len(p.unsupported) > 0 {
		log.Warn("envoyproxy/ratelimit settings that sluice does not support are ignored (docs/envoy.md)", "variables", strings.Join(p.unsupported, ", "))
	}
	stopTracing, err := startTracing(cfg.Tracing)
	if err != nil {
		return failure{err}
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(ctx)
	}()
	var running atomic.Pointer[gateway.Server]
	st, err := openStore(cfg.Store, log, runningBudgets(cfg, &running))
	if err != nil {
		return failure{err}
	}
	srv, err := gateway.NewServer(cfg, "", st, log)
	if err != nil {
		return failure{err}
	}
	running.Store(srv)
	defer srv.Close()
	svc, err := startRLS(cfg, srv, nil, log)
	if err != nil {
		return err
	}
	// The reference's gRPC health service answers for "ratelimit".
	svc.health.SetServingStatus(ratelimitName, healthpb.HealthCheckResponse_SERVING)

	h := &refHealth{admin: srv.Admin(), active: p.activeRedis}
	if p.oneConfig && svc.xds != nil { // healthy once the first update over xDS has been applied
		go func() {
			select {
			case <-svc.xds.Loaded():
				h.loaded.Store(true)
			case <-ctx.Done():
			}
		}()
	} else {
		h.loaded.Store(true)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /healthcheck", h)
	mux.Handle("POST /json", refJSON(svc.svc))
	var lns []net.Listener
	listen := func(addr, what string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, failure{fmt.Errorf("listen %s (%s): %w", addr, what, err)}
		}
		lns = append(lns, ln)
		return ln, nil
	}
	rlsLn, err := listen(cfg.RLS.Listen, "GRPC_HOST:GRPC_PORT")
	if err != nil {
		return err
	}
	if rlsLn, err = rlsTLS(rlsLn, cfg.RLS.TLS); err != nil {
		rlsLn.Close()
		return configError{fmt.Errorf("GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT: %w", err)}
	}
	healthLn, err := listen(p.health, "HOST:PORT")
	if err != nil {
		return err
	}
	servers := []*http.Server{{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute}}
	serving := []net.Listener{healthLn}
	if p.metrics != "" {
		ln, err := listen(p.metrics, "PROMETHEUS_ADDR")
		if err != nil {
			return err
		}
		ms := srv.MetricsServer()
		metrics, path := ms.Handler, p.path
		ms.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == path {
				r = r.Clone(r.Context())
				r.URL.Path = "/metrics"
			}
			metrics.ServeHTTP(w, r)
		})
		servers, serving = append(servers, ms), append(serving, ln)
	}
	errs := make(chan error, 3)
	go func() { errs <- svc.grpc.Serve(rlsLn) }()
	for i, hs := range servers {
		go func() { errs <- hs.Serve(serving[i]) }()
	}
	log.Info("Envoy rate limit service listening (gRPC), configured by envoyproxy/ratelimit's environment",
		"addr", rlsLn.Addr().String(), "tls", cfg.RLS.TLS != nil, "healthcheck", healthLn.Addr().String(),
		"metrics", p.metrics, "envoy_config", cfg.RLS.EnvoyConfig)

	files, stamp := cfg.RLS.EnvoyConfig, filesStamp(cfg.RLS.EnvoyConfig)
	failed := "" // the last reload's error, logged once until it changes
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if p.xds {
				continue
			}
			now, err := envoyFiles(p.dir, p.dots)
			if err == nil && slices.Equal(now, files) && filesStamp(now) == stamp {
				continue
			}
			if err == nil {
				files, stamp = now, filesStamp(now)
				var conf *envoyconf.Config
				if conf, err = envoyconf.Load(files...); err == nil {
					svc.svc.Swap(conf)
					failed = ""
					log.Info("Envoy rate limit service configuration reloaded", "envoy_config", fmt.Sprint(files))
					continue
				}
			}
			if err.Error() != failed {
				failed = err.Error()
				log.Error("Envoy rate limit service configuration not reloaded; the previous one keeps running", "error", failed)
			}
		case sig := <-signals:
			// As the reference: /healthcheck fails from now on; the calls in flight finish.
			h.stopping.Store(true)
			drain(log, sig, cfg.Server.DrainTimeout, nil, svc, servers...)
			return nil
		case err := <-errs:
			if err == nil || errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return failure{err}
		case <-ctx.Done():
			return nil
		}
	}
}

// refHealth is the reference's GET /healthcheck: 200 "OK" while healthy, else 500 with no body.
// Healthy: not stopping (SIGTERM), the store has answered once (the reference starts only then)
// or, with active (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION), answers now, and a configuration has
// loaded (loaded).
type refHealth struct {
	admin    http.Handler // the admin listener's, for its /readyz
	active   bool
	loaded   atomic.Bool
	answered atomic.Bool
	stopping atomic.Bool
}

func (h *refHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.stopping.Load() && h.loaded.Load() && h.storeOK(r) {
		io.WriteString(w, "OK") //nolint:errcheck // the client's loss
		return
	}
	w.WriteHeader(http.StatusInternalServerError)
}

// storeOK asks the admin handler's /readyz whether decisions go to the store.
func (h *refHealth) storeOK(r *http.Request) bool {
	if h.answered.Load() && !h.active {
		return true
	}
	rec := &statusRecorder{header: http.Header{}}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "/readyz", nil)
	h.admin.ServeHTTP(rec, req)
	ok := rec.status == 0 || rec.status == http.StatusOK
	if ok {
		h.answered.Store(true)
	}
	return ok
}

// statusRecorder is the ResponseWriter of an internal request whose status alone matters.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

// refJSON is the reference's POST /json: a RateLimitRequest in protobuf's JSON, answered with the
// RateLimitResponse in JSON, status 429 when over the limit, 400 for a request that cannot be
// read or that the service refuses.
func refJSON(svc *rls.Service) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var req rlspb.RateLimitRequest
		if err == nil {
			err = protojson.Unmarshal(body, &req)
		}
		var resp *rlspb.RateLimitResponse
		if err == nil {
			resp, err = svc.ShouldRateLimit(r.Context(), &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.GetOverallCode() {
		case rlspb.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		case rlspb.RateLimitResponse_UNKNOWN:
			w.WriteHeader(http.StatusInternalServerError)
		}
		w.Write(out) //nolint:errcheck // the client's loss
	})
}
