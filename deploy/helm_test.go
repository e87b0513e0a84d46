package deploy

// The Helm chart (helm/sluice) is linted and rendered by a real helm, built once from the Go
// module proxy into the user's cache directory, and its rendered objects are checked against each
// other and against sluice's own configuration parser: the probes, the Service, the scrape
// annotations and the ServiceMonitor must reach the ports the ConfigMap's configuration listens
// on, the secrets must land in the variables the configuration names, and the disruption budget
// must leave a pod evictable. Every check is also shown to fail on objects that are wrong.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/config"
)

const (
	helmVersion = "v3.22.0"
	helmChart   = "helm/sluice"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns a helm of helmVersion: the cached one in os.UserCacheDir()/sluice-helm, or
// one built now with `go install` (a few minutes the first time) and cached there.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = helmBuild(t) })
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

func helmBuild(t *testing.T) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for helm: %w", err)
	}
	dir := filepath.Join(cache, "sluice-helm", helmVersion)
	bin := filepath.Join(dir, "helm")
	// The cache directory is the version's; a helm built by go install says only its minor
	// version ("v3.22"), so that much is checked.
	if out, err := exec.Command(bin, "version", "--short").Output(); err == nil {
		if v := strings.TrimSpace(string(out)); v != "" && strings.HasPrefix(helmVersion, v) {
			return bin, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Built into a directory of its own and renamed into place, so that a test run elsewhere at
	// the same time never finds half a binary.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goCmd); err != nil {
		goCmd = "go"
	}
	// Built within the test's deadline, with a clear error rather than the test binary's panic.
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-30*time.Second))
		defer cancel()
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, goCmd, "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	// Outside this module (go install pkg@version ignores it anyway) and without its GOFLAGS.
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("go install helm %s did not finish within the test's -timeout (%s so far): give the test more time", helmVersion, time.Since(start).Round(time.Second))
		}
		return "", fmt.Errorf("go install helm %s: %v\n%s", helmVersion, err, out)
	}
	t.Logf("built helm %s in %s into %s", helmVersion, time.Since(start).Round(time.Second), bin)
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// helmRun runs helm with args from this directory and returns its standard output; the error
// carries its standard error.
func helmRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	// A helm of its own: no repositories, plugins or registry logins of the user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// helmObj is one rendered Kubernetes object.
type helmObj map[string]any

func (o helmObj) kind() string { s, _ := o["kind"].(string); return s }
func (o helmObj) name() string { return helmStr(helmGet(o, "metadata", "name")) }

// helmGet walks maps (string keys) and lists (int keys); nil where there is nothing.
func helmGet(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				if o, isObj := v.(helmObj); isObj {
					m, ok = o, true
				}
			}
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func helmStr(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func helmList(v any) []any { l, _ := v.([]any); return l }

// helmTemplate renders the chart with the values files and returns its objects.
func helmTemplate(t *testing.T, values ...string) ([]helmObj, error) {
	t.Helper()
	args := []string{"template", "sluice", helmChart, "--namespace", "edge"}
	for _, v := range values {
		args = append(args, "-f", v)
	}
	out, err := helmRun(t, args...)
	if err != nil {
		return nil, err
	}
	return helmDecode(out)
}

func helmDecode(text string) ([]helmObj, error) {
	var objs []helmObj
	dec := yaml.NewDecoder(strings.NewReader(text))
	for {
		// A plain map: decoded into helmObj, yaml would make every nested mapping a helmObj too.
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("rendered YAML: %w", err)
		}
		if o != nil {
			objs = append(objs, helmObj(o))
		}
	}
}

// helmValues writes a values file into a temporary directory.
func helmValues(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// helmExpect is what a rendering must hold besides its consistency.
type helmExpect struct {
	replicas       int
	serviceMonitor bool
	rls            bool
	secretEnvs     []string // variables filled from Secrets, sorted
	adminTLSSecret string   // the Secret of the admin listener's certificate, if any
}

// helmAdminTLSDir is where the chart mounts values.adminTLS.existingSecret.
const helmAdminTLSDir = "/etc/sluice-admin-tls"

// helmTestCertificate writes a self-signed certificate as tls.crt, its key as tls.key and itself
// as ca.crt into dir, the files of a kubernetes.io/tls Secret with a CA.
func helmTestCertificate(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": cert, "ca.crt": cert, "tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// helmCheck checks rendered objects and returns every problem found (none: consistent). It reads
// the ConfigMap's files into a temporary directory and parses its sluice.yaml with the config
// package, with each variable the Deployment fills from a Secret set (to a 64-byte stand-in).
func helmCheck(t *testing.T, objs []helmObj, want helmExpect) []string {
	t.Helper()
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	byKind := map[string][]helmObj{}
	var kinds []string
	for _, o := range objs {
		byKind[o.kind()] = append(byKind[o.kind()], o)
		kinds = append(kinds, o.kind())
	}
	sort.Strings(kinds)
	wantKinds := []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Service"}
	if want.serviceMonitor {
		wantKinds = append(wantKinds, "ServiceMonitor")
	}
	sort.Strings(wantKinds)
	if strings.Join(kinds, ",") != strings.Join(wantKinds, ",") {
		return []string{fmt.Sprintf("rendered kinds %v, want %v", kinds, wantKinds)}
	}
	cm, dep, svc, pdb := byKind["ConfigMap"][0], byKind["Deployment"][0], byKind["Service"][0], byKind["PodDisruptionBudget"][0]

	// The pod and its container.
	pod := helmGet(dep, "spec", "template")
	podLabels, _ := helmGet(pod, "metadata", "labels").(map[string]any)
	containers := helmList(helmGet(pod, "spec", "containers"))
	if len(containers) != 1 {
		return append(problems, fmt.Sprintf("Deployment: %d containers, want 1", len(containers)))
	}
	c := containers[0]
	ports := map[string]int{} // container port name → number
	for _, p := range helmList(helmGet(c, "ports")) {
		n, _ := strconv.Atoi(helmStr(helmGet(p, "containerPort")))
		ports[helmStr(helmGet(p, "name"))] = n
	}
	// resolve turns a port (a name of the container's, or a number) into the number.
	resolve := func(v any) int {
		if n, err := strconv.Atoi(helmStr(v)); err == nil {
			return n
		}
		if n, ok := ports[helmStr(v)]; ok {
			return n
		}
		return -1
	}
	if n, _ := strconv.Atoi(helmStr(helmGet(dep, "spec", "replicas"))); n != want.replicas {
		bad("Deployment: replicas %v, want %d", helmGet(dep, "spec", "replicas"), want.replicas)
	}
	selects := func(what string, sel any) {
		m, _ := sel.(map[string]any)
		if len(m) == 0 {
			bad("%s: no selector", what)
		}
		for k, v := range m {
			if helmStr(podLabels[k]) != helmStr(v) {
				bad("%s: selector %s=%v does not match the pods (%v)", what, k, v, podLabels[k])
			}
		}
	}
	selects("Deployment", helmGet(dep, "spec", "selector", "matchLabels"))

	// The configuration: every file of the ConfigMap, mounted as a directory at /etc/sluice
	// (where the image's entrypoint reads sluice.yaml), parsed as sluice would.
	data, _ := helmGet(cm, "data").(map[string]any)
	cfgText := helmStr(data["sluice.yaml"])
	if cfgText == "" {
		return append(problems, "ConfigMap: no sluice.yaml")
	}
	mounted := false
	for _, m := range helmList(helmGet(c, "volumeMounts")) {
		if helmStr(helmGet(m, "mountPath")) != "/etc/sluice" {
			continue
		}
		for _, v := range helmList(helmGet(pod, "spec", "volumes")) {
			if helmGet(v, "name") == helmGet(m, "name") && helmStr(helmGet(v, "configMap", "name")) == cm.name() {
				mounted = true
				if helmGet(m, "subPath") != nil {
					bad("the ConfigMap is mounted with subPath: the kubelet never updates it")
				}
			}
		}
	}
	if !mounted {
		bad("ConfigMap %s is not mounted at /etc/sluice", cm.name())
	}
	dir := t.TempDir()

	// The admin certificate: the configuration names its files in the Secret's mount, which must
	// be mounted; stand-ins are written there (under dir) so that it parses as in the pod.
	adminTLS := strings.Contains(helmStr(data["sluice.yaml"]), helmAdminTLSDir)
	if adminTLS {
		secretMounted := false
		for _, m := range helmList(helmGet(c, "volumeMounts")) {
			if helmStr(helmGet(m, "mountPath")) != helmAdminTLSDir {
				continue
			}
			for _, v := range helmList(helmGet(pod, "spec", "volumes")) {
				if helmGet(v, "name") == helmGet(m, "name") && helmStr(helmGet(v, "secret", "secretName")) == want.adminTLSSecret {
					secretMounted = true
				}
			}
		}
		if !secretMounted {
			bad("admin.tls names files in %s, where Secret %q is not mounted", helmAdminTLSDir, want.adminTLSSecret)
		}
		data = maps.Clone(data) // the rendered object stays as rendered
		tlsDir := filepath.Join(dir, "admin-tls")
		helmTestCertificate(t, tlsDir)
		data["sluice.yaml"] = strings.ReplaceAll(helmStr(data["sluice.yaml"]), helmAdminTLSDir, tlsDir)
		cfgText = helmStr(data["sluice.yaml"])
	}
	for _, p := range []string{"readinessProbe", "livenessProbe"} {
		scheme, wantScheme := helmStr(helmGet(c, p, "httpGet", "scheme")), "HTTP"
		if adminTLS {
			wantScheme = "HTTPS"
		}
		if scheme != wantScheme {
			bad("%s scheme %q, want %s (admin.tls: %v)", p, scheme, wantScheme, adminTLS)
		}
	}
	for name, text := range data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(helmStr(text)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Secrets: each variable filled from a Secret is one the configuration names (password_env,
	// secret_env) and the other way round; without that sluice would not start ("unset").
	var secretEnvs []string
	envs := map[string]bool{}
	for _, e := range helmList(helmGet(c, "env")) {
		name := helmStr(helmGet(e, "name"))
		envs[name] = true
		if ref := helmGet(e, "valueFrom", "secretKeyRef"); ref != nil {
			if helmStr(helmGet(ref, "name")) == "" || helmStr(helmGet(ref, "key")) == "" {
				bad("env %s: secretKeyRef without name or key", name)
			}
			secretEnvs = append(secretEnvs, name)
			t.Setenv(name, strings.Repeat("s", 64))
		}
	}
	sort.Strings(secretEnvs)
	if strings.Join(secretEnvs, ",") != strings.Join(want.secretEnvs, ",") {
		bad("variables from Secrets %v, want %v", secretEnvs, want.secretEnvs)
	}
	var raw any
	if err := yaml.Unmarshal([]byte(cfgText), &raw); err != nil {
		return append(problems, "ConfigMap sluice.yaml: "+err.Error())
	}
	named := map[string]bool{}
	helmEnvNames(raw, named)
	for name := range named {
		if !envs[name] {
			bad("the configuration reads $%s, which the Deployment does not set", name)
		}
	}
	for _, name := range secretEnvs {
		if !named[name] {
			bad("the Deployment fills $%s from a Secret, which the configuration does not read", name)
		}
	}
	cfg, err := config.Parse([]byte(cfgText), filepath.Join(dir, "sluice.yaml"))
	if err != nil {
		return append(problems, "ConfigMap sluice.yaml does not parse: "+err.Error())
	}
	// And the binary agrees: `sluice check` accepts the rendered files as they will be mounted
	// (the Envoy files beside it included), with the Secrets' variables set.
	if out, err := exec.Command(sluiceBinary(t), "check", "--config", filepath.Join(dir, "sluice.yaml")).CombinedOutput(); err != nil {
		bad("sluice check refuses the rendered configuration: %v\n%s", err, out)
	}
	if cfg.Store.Type != config.StoreRedis && want.replicas > 1 {
		bad("%d replicas on the %s store: each pod would count separately", want.replicas, cfg.Store.Type)
	}
	if cfg.Store.Type == config.StoreRedis && cfg.Store.PasswordEnv != "" && !envs[cfg.Store.PasswordEnv] {
		bad("store password_env %s is not set by the Deployment", cfg.Store.PasswordEnv)
	}

	// Listeners: on every interface (the kubelet and the Service come from outside the pod), on
	// the container's ports.
	listenPort := func(what, addr string) int {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			bad("%s %q: %v", what, addr, err)
			return -2
		}
		if host != "" && host != "0.0.0.0" && host != "::" {
			bad("%s %q listens on %s only: unreachable from outside the pod", what, addr, host)
		}
		n, _ := strconv.Atoi(port)
		return n
	}
	admin := listenPort("admin_listen", cfg.AdminListen)
	if admin != ports["admin"] {
		bad("admin_listen %s, but the container's admin port is %d", cfg.AdminListen, ports["admin"])
	}
	if p := listenPort("listen", cfg.Listen); p != ports["proxy"] {
		bad("listen %s, but the container's proxy port is %d", cfg.Listen, ports["proxy"])
	}
	_, rlsPort := ports["grpc-rls"]
	switch {
	case want.rls != (cfg.RLS != nil):
		bad("rls served: %v, want %v", cfg.RLS != nil, want.rls)
	case want.rls != rlsPort:
		bad("container rls port: %v, want %v", rlsPort, want.rls)
	case cfg.RLS != nil:
		if p := listenPort("rls.listen", cfg.RLS.Listen); p != ports["grpc-rls"] {
			bad("rls.listen %s, but the container's rls port is %d", cfg.RLS.Listen, ports["grpc-rls"])
		}
		if len(cfg.RLS.EnvoyConfig) == 0 {
			bad("rls without envoy_config files")
		}
	}

	// Probes: on the admin port that the configuration listens on.
	for _, p := range []struct{ field, path string }{{"readinessProbe", "/readyz"}, {"livenessProbe", "/healthz"}} {
		get := helmGet(c, p.field, "httpGet")
		if got := helmStr(helmGet(get, "path")); got != p.path {
			bad("%s path %q, want %s", p.field, got, p.path)
		}
		if got := resolve(helmGet(get, "port")); got != admin {
			bad("%s on port %v (%d), but admin_listen is %s", p.field, helmGet(get, "port"), got, cfg.AdminListen)
		}
	}

	// The Service: every port reaches a container port; proxy and admin (and rls) are served.
	selects("Service", helmGet(svc, "spec", "selector"))
	svcPorts := map[string]int{} // Service port name → the container port it reaches
	for _, p := range helmList(helmGet(svc, "spec", "ports")) {
		name, target := helmStr(helmGet(p, "name")), helmGet(p, "targetPort")
		if target == nil {
			target = helmGet(p, "port")
		}
		n := resolve(target)
		if n < 0 || !helmHasPort(ports, n) {
			bad("Service port %s: targetPort %v is no container port (%v)", name, target, ports)
		}
		svcPorts[name] = n
	}
	for _, name := range []string{"proxy", "admin"} {
		if svcPorts[name] != ports[name] {
			bad("Service port %s reaches %d, want the container's %d", name, svcPorts[name], ports[name])
		}
	}
	if want.rls && svcPorts["grpc-rls"] != ports["grpc-rls"] {
		bad("Service port grpc-rls reaches %d, want the container's %d", svcPorts["grpc-rls"], ports["grpc-rls"])
	}

	// Prometheus: the pods' annotations and the ServiceMonitor scrape /metrics on the admin port.
	ann, _ := helmGet(pod, "metadata", "annotations").(map[string]any)
	if helmStr(ann["prometheus.io/scrape"]) != "true" || helmStr(ann["prometheus.io/path"]) != "/metrics" ||
		helmStr(ann["prometheus.io/port"]) != strconv.Itoa(admin) {
		bad("prometheus annotations scrape=%v port=%v path=%v, want true %d /metrics",
			ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/path"], admin)
	}
	if len(helmStr(ann["checksum/config"])) != 2*sha256.Size {
		bad("no checksum/config annotation: a configuration change would not roll the pods")
	}
	if want.serviceMonitor {
		sm := byKind["ServiceMonitor"][0]
		for k, v := range helmGet(sm, "spec", "selector", "matchLabels").(map[string]any) {
			if l, _ := helmGet(svc, "metadata", "labels").(map[string]any); helmStr(l[k]) != helmStr(v) {
				bad("ServiceMonitor: selector %s=%v does not match the Service", k, v)
			}
		}
		ep := helmGet(sm, "spec", "endpoints", 0)
		if n, ok := svcPorts[helmStr(helmGet(ep, "port"))]; !ok || n != admin || helmStr(helmGet(ep, "path")) != "/metrics" {
			bad("ServiceMonitor scrapes port %v path %v, want the admin port (%d) /metrics",
				helmGet(ep, "port"), helmGet(ep, "path"), admin)
		}
	}

	// The disruption budget selects the pods and leaves one evictable.
	selects("PodDisruptionBudget", helmGet(pdb, "spec", "selector", "matchLabels"))
	minAvail, hasMin := helmGet(pdb, "spec", "minAvailable"), helmGet(pdb, "spec", "minAvailable") != nil
	maxUnavail, hasMax := helmGet(pdb, "spec", "maxUnavailable"), helmGet(pdb, "spec", "maxUnavailable") != nil
	switch {
	case hasMin == hasMax:
		bad("PodDisruptionBudget: exactly one of minAvailable (%v) and maxUnavailable (%v)", minAvail, maxUnavail)
	case hasMin:
		if n, err := strconv.Atoi(helmStr(minAvail)); err != nil || n >= want.replicas {
			bad("PodDisruptionBudget minAvailable %v with %d replicas blocks every disruption", minAvail, want.replicas)
		}
	default:
		if n, err := strconv.Atoi(helmStr(maxUnavail)); err != nil || n < 1 {
			bad("PodDisruptionBudget maxUnavailable %v blocks every disruption", maxUnavail)
		}
	}

	// Hardening and resources.
	sc := helmGet(c, "securityContext")
	for _, f := range []struct {
		field string
		want  any
	}{{"runAsNonRoot", true}, {"readOnlyRootFilesystem", true}, {"allowPrivilegeEscalation", false}} {
		if helmGet(sc, f.field) != f.want {
			bad("securityContext.%s %v, want %v", f.field, helmGet(sc, f.field), f.want)
		}
	}
	if drop := helmList(helmGet(sc, "capabilities", "drop")); len(drop) != 1 || helmStr(drop[0]) != "ALL" {
		bad("securityContext.capabilities.drop %v, want [ALL]", drop)
	}
	for _, k := range []string{"requests", "limits"} {
		if r, _ := helmGet(c, "resources", k).(map[string]any); r["cpu"] == nil || r["memory"] == nil {
			bad("resources.%s %v: want cpu and memory", k, r)
		}
	}
	return problems
}

func helmHasPort(ports map[string]int, n int) bool {
	for _, p := range ports {
		if p == n {
			return true
		}
	}
	return false
}

// helmEnvNames collects the values of every password_env and secret_env in a configuration.
func helmEnvNames(v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "password_env" || k == "secret_env") {
				into[s] = true
			}
			helmEnvNames(x, into)
		}
	case []any:
		for _, x := range v {
			helmEnvNames(x, into)
		}
	}
}

// helmOptions exercises the chart's options: a ServiceMonitor, Envoy's rate limit service, the
// Redis password and a JWT secret from existing Secrets, a Redis Cluster, a PDB by minAvailable.
const helmOptions = `
replicaCount: 4
redis:
  addrs: [redis-0.redis:6379, redis-1.redis:6379, redis-2.redis:6379]
  existingSecret: sluice-redis
  secretKey: password
  passwordEnv: SLUICE_REDIS_PASSWORD
jwt:
  existingSecret: sluice-jwt
  secretEnv: SLUICE_JWT_SECRET
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
podDisruptionBudget:
  maxUnavailable: null
  minAvailable: 2
rls:
  enabled: true
  envoyConfig:
    edge.yaml: |
      domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 10}
config:
  upstream: http://api.edge.svc:8080/v1
  listen: 127.0.0.1:1234            # replaced by the chart
  store:
    on_error: local
    local_share: 0.25
    timeout: 100ms
  identity:
    - jwt: {secret_env: SLUICE_JWT_SECRET, issuer: https://auth.example.com}
    - api_key: {header: X-API-Key}
    - ip: {}
  policies:
    - {name: standard, algorithm: token-bucket, limit: 100, period: 1m, burst: 20}
    - {name: anonymous, algorithm: fixed-window, limit: 30, period: 1m}
  default_policy: anonymous
  clients:
    - {name: partner-a, api_key_sha256: 579084b337941a6a4a172d804df80263a01442341327e1c8aded14669aee6724, policy: standard}
`

func TestHelmLint(t *testing.T) {
	for _, tc := range []struct{ name, values string }{{"defaults", ""}, {"options", helmOptions}} {
		t.Run(tc.name, func(t *testing.T) {
			// Errors fail; warnings are reported (there are none today: --strict passes too).
			args := []string{"lint", helmChart}
			if tc.values != "" {
				args = append(args, "-f", helmValues(t, tc.values))
			}
			out, err := helmRun(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "[WARNING]") || strings.Contains(line, "[INFO]") {
					t.Log(line)
				}
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

func TestHelmTemplateDefaults(t *testing.T) {
	objs, err := helmTemplate(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3}) {
		t.Error(p)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.kind())
	}
	t.Logf("rendered: %v", kinds)
}

func TestHelmTemplateOptions(t *testing.T) {
	objs, err := helmTemplate(t, helmValues(t, helmOptions))
	if err != nil {
		t.Fatal(err)
	}
	want := helmExpect{replicas: 4, serviceMonitor: true, rls: true, secretEnvs: []string{"SLUICE_JWT_SECRET", "SLUICE_REDIS_PASSWORD"}}
	for _, p := range helmCheck(t, objs, want) {
		t.Error(p)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.kind())
	}
	t.Logf("rendered: %v", kinds)

	// What the chart decides, as the configuration says it.
	for _, o := range objs {
		if o.kind() == "Deployment" {
			refs := map[string]string{}
			for _, e := range helmList(helmGet(o, "spec", "template", "spec", "containers", 0, "env")) {
				ref := helmGet(e, "valueFrom", "secretKeyRef")
				refs[helmStr(helmGet(e, "name"))] = helmStr(helmGet(ref, "name")) + "/" + helmStr(helmGet(ref, "key"))
			}
			if refs["SLUICE_REDIS_PASSWORD"] != "sluice-redis/password" || refs["SLUICE_JWT_SECRET"] != "sluice-jwt/jwt-secret" {
				t.Errorf("secret references %v: want SLUICE_REDIS_PASSWORD from sluice-redis/password, SLUICE_JWT_SECRET from sluice-jwt/jwt-secret", refs)
			}
		}
		if o.kind() != "ConfigMap" {
			continue
		}
		cfgText := helmStr(helmGet(o, "data", "sluice.yaml"))
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(helmStr(helmGet(o, "data", "edge.yaml"))), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse([]byte(cfgText), filepath.Join(dir, "sluice.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "0.0.0.0:8080" || cfg.AdminListen != "0.0.0.0:9090" || cfg.RLS.Listen != "0.0.0.0:8081" {
			t.Errorf("listen %s, admin_listen %s, rls.listen %s: want the chart's ports on every interface", cfg.Listen, cfg.AdminListen, cfg.RLS.Listen)
		}
		if got := strings.Join(cfg.Store.Addrs, ","); cfg.Store.Type != config.StoreRedis || got != "redis-0.redis:6379,redis-1.redis:6379,redis-2.redis:6379" ||
			cfg.Store.PasswordEnv != "SLUICE_REDIS_PASSWORD" || cfg.Store.OnError.String() != "local" || cfg.Store.LocalShare != 0.25 {
			t.Errorf("store %+v: want redis on the three addrs, password_env SLUICE_REDIS_PASSWORD, on_error local (0.25)", cfg.Store)
		}
		if len(cfg.RLS.EnvoyConfig) != 1 || filepath.Base(cfg.RLS.EnvoyConfig[0]) != "edge.yaml" {
			t.Errorf("rls.envoy_config %v, want [edge.yaml]", cfg.RLS.EnvoyConfig)
		}
	}
}

// With redis.sentinel, the store finds its primary through the sentinels (no addrs), the
// sentinels' password comes from its Secret, and replicas_ack from config stays; a sentinel
// without addresses is refused.
func TestHelmSentinel(t *testing.T) {
	values := `redis:
  addrs: []
  existingSecret: sluice-redis
  passwordEnv: SLUICE_REDIS_PASSWORD
  sentinel:
    master: sluice-primary
    addrs: [redis-sentinel-0.redis-sentinel:26379, redis-sentinel-1.redis-sentinel:26379]
    existingSecret: sluice-sentinel
    passwordEnv: SLUICE_SENTINEL_PASSWORD
config:
  upstream: http://api:8080
  store: {replicas_ack: 1, on_error: fail-closed}
`
	objs, err := helmTemplate(t, helmValues(t, values))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3, secretEnvs: []string{"SLUICE_REDIS_PASSWORD", "SLUICE_SENTINEL_PASSWORD"}}) {
		t.Error(p)
	}
	for _, o := range objs {
		if o.kind() != "ConfigMap" {
			continue
		}
		t.Setenv("SLUICE_REDIS_PASSWORD", "p")
		t.Setenv("SLUICE_SENTINEL_PASSWORD", "s")
		cfg, err := config.Parse([]byte(helmStr(helmGet(o, "data", "sluice.yaml"))), filepath.Join(t.TempDir(), "sluice.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		st := cfg.Store
		if st.Type != config.StoreRedis || len(st.Addrs) != 0 || st.Sentinel == nil || st.Sentinel.Master != "sluice-primary" ||
			len(st.Sentinel.Addrs) != 2 || st.ReplicasAck != 1 {
			t.Errorf("store %+v (sentinel %+v): want redis through the sentinels of sluice-primary, replicas_ack 1", st, st.Sentinel)
		}
	}
	if _, err := helmTemplate(t, helmValues(t, "redis: {addrs: [], sentinel: {master: m}}\n")); err == nil || !strings.Contains(err.Error(), "redis.sentinel.master needs redis.sentinel.addrs") {
		t.Errorf("a sentinel without addresses: %v", err)
	}
}

// With adminTLS, the chart mounts the Secret, writes admin.tls naming its files (and the client
// CA with clientCA) and makes the probes HTTPS; the rendered configuration parses with the
// Secret's files in place, and a probe left on HTTP is caught.
func TestHelmAdminTLS(t *testing.T) {
	objs, err := helmTemplate(t, helmValues(t, "adminTLS: {existingSecret: sluice-admin-tls, clientCA: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := helmExpect{replicas: 3, adminTLSSecret: "sluice-admin-tls"}
	for _, p := range helmCheck(t, objs, want) {
		t.Error(p)
	}
	for _, o := range objs {
		if o.kind() == "ConfigMap" {
			if text := helmStr(helmGet(o, "data", "sluice.yaml")); !strings.Contains(text, "client_ca_file: "+helmAdminTLSDir+"/ca.crt") {
				t.Errorf("the configuration does not want client certificates:\n%s", text)
			}
		}
	}
	plain := helmCopy(t, objs)
	helmEdit(plain, "Deployment", func(o helmObj) {
		c := helmGet(o, "spec", "template", "spec", "containers", 0).(map[string]any)
		c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any)["scheme"] = "HTTP"
	})
	helmWantProblem(t, helmCheck(t, plain, want), `readinessProbe scheme "HTTP", want HTTPS`)
}

// TestHelmConfigChangeRollsPods: the checksum annotation follows the configuration, so a change
// of the policies rolls the pods; rollOnConfigChange: false leaves it out (sluice reloads the
// file the kubelet updates).
func TestHelmConfigChangeRollsPods(t *testing.T) {
	checksum := func(values string) string {
		t.Helper()
		objs, err := helmTemplate(t, helmValues(t, values))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.kind() == "Deployment" {
				return helmStr(helmGet(o, "spec", "template", "metadata", "annotations", "checksum/config"))
			}
		}
		t.Fatal("no Deployment")
		return ""
	}
	a := checksum("config: {upstream: http://a:80}\n")
	b := checksum("config: {upstream: http://b:80}\n")
	if a == "" || a == b {
		t.Errorf("checksum/config %q and %q: want two different checksums", a, b)
	}
	if c := checksum("rollOnConfigChange: false\n"); c != "" {
		t.Errorf("rollOnConfigChange false: checksum/config %q, want none", c)
	}
}

// TestHelmRefusesValues: values that cannot work fail the render with the reason.
func TestHelmRefusesValues(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"replicas without redis", "redis: {addrs: []}\n", "replicaCount > 1 needs redis.addrs"},
		{"minAvailable = replicas", "podDisruptionBudget: {maxUnavailable: null, minAvailable: 3}\n", "minAvailable must be less than replicaCount"},
		{"maxUnavailable 0", "podDisruptionBudget: {maxUnavailable: 0}\n", "maxUnavailable must be at least 1"},
		{"rls without files", "rls: {enabled: true}\n", "rls.enabled needs rls.envoyConfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, helmValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// One replica may use the memory store.
	objs, err := helmTemplate(t, helmValues(t, "replicaCount: 1\nredis: {addrs: []}\npodDisruptionBudget: {maxUnavailable: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 1}) {
		t.Error(p)
	}
}

// TestHelmChecksCatch: the checks fail on values that render a chart which cannot work, and on
// rendered objects broken one at a time.
func TestHelmChecksCatch(t *testing.T) {
	t.Run("values", func(t *testing.T) {
		for _, tc := range []struct{ name, values, want string }{
			// The configuration reads a JWT secret from a variable the Secret does not fill.
			{"jwt secret in another variable", `
jwt: {existingSecret: sluice-jwt, secretEnv: JWT_KEY}
config:
  upstream: http://api:80
  identity: [{jwt: {secret_env: JWT_SECRET}}]
`, "the configuration reads $JWT_SECRET, which the Deployment does not set"},
			// Ready when the process is, not when the store is.
			{"readiness on /metrics", "probes: {readinessPath: /metrics}\n", `readinessProbe path "/metrics", want /readyz`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				objs, err := helmTemplate(t, helmValues(t, tc.values))
				if err != nil {
					t.Fatal(err)
				}
				wantSecrets := []string(nil)
				if strings.Contains(tc.values, "existingSecret") {
					wantSecrets = []string{"JWT_KEY"}
				}
				helmWantProblem(t, helmCheck(t, objs, helmExpect{replicas: 3, secretEnvs: wantSecrets}), tc.want)
			})
		}
	})

	base, err := helmTemplate(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(objs []helmObj)
		want   string
	}{
		{"admin on another port than the probes", func(objs []helmObj) {
			helmEdit(objs, "ConfigMap", func(o helmObj) {
				data := helmGet(o, "data").(map[string]any)
				data["sluice.yaml"] = strings.Replace(data["sluice.yaml"].(string), "admin_listen: 0.0.0.0:9090", "admin_listen: 0.0.0.0:9091", 1)
			})
		}, "readinessProbe on port admin (9090), but admin_listen is 0.0.0.0:9091"},
		{"admin on loopback", func(objs []helmObj) {
			helmEdit(objs, "ConfigMap", func(o helmObj) {
				data := helmGet(o, "data").(map[string]any)
				data["sluice.yaml"] = strings.Replace(data["sluice.yaml"].(string), "admin_listen: 0.0.0.0:9090", "admin_listen: 127.0.0.1:9090", 1)
			})
		}, `admin_listen "127.0.0.1:9090" listens on 127.0.0.1 only`},
		{"a configuration that does not parse", func(objs []helmObj) {
			helmEdit(objs, "ConfigMap", func(o helmObj) {
				data := helmGet(o, "data").(map[string]any)
				data["sluice.yaml"] = data["sluice.yaml"].(string) + "polcies: []\n"
			})
		}, `unknown field "polcies"`},
		{"Service to a port nobody listens on", func(objs []helmObj) {
			helmEdit(objs, "Service", func(o helmObj) {
				helmGet(o, "spec", "ports", 0).(map[string]any)["targetPort"] = 8090
			})
		}, "Service port proxy: targetPort 8090 is no container port"},
		{"PDB that blocks every eviction", func(objs []helmObj) {
			helmEdit(objs, "PodDisruptionBudget", func(o helmObj) {
				spec := helmGet(o, "spec").(map[string]any)
				delete(spec, "maxUnavailable")
				spec["minAvailable"] = 3
			})
		}, "minAvailable 3 with 3 replicas blocks every disruption"},
		{"memory store on several replicas", func(objs []helmObj) {
			helmEdit(objs, "ConfigMap", func(o helmObj) {
				data := helmGet(o, "data").(map[string]any)
				var cfg map[string]any
				if err := yaml.Unmarshal([]byte(data["sluice.yaml"].(string)), &cfg); err != nil {
					t.Fatal(err)
				}
				cfg["store"] = map[string]any{"type": "memory"}
				text, err := yaml.Marshal(cfg)
				if err != nil {
					t.Fatal(err)
				}
				data["sluice.yaml"] = string(text)
			})
		}, "3 replicas on the memory store"},
		{"scrape on the proxy port", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "metadata", "annotations").(map[string]any)["prometheus.io/port"] = "8080"
			})
		}, "prometheus annotations"},
		{"writable root", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "spec", "containers", 0, "securityContext").(map[string]any)["readOnlyRootFilesystem"] = false
			})
		}, "securityContext.readOnlyRootFilesystem false"},
		{"PDB selecting other pods", func(objs []helmObj) {
			helmEdit(objs, "PodDisruptionBudget", func(o helmObj) {
				helmGet(o, "spec", "selector", "matchLabels").(map[string]any)["app.kubernetes.io/instance"] = "other"
			})
		}, "PodDisruptionBudget: selector app.kubernetes.io/instance=other does not match the pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := helmCopy(t, base)
			if problems := helmCheck(t, objs, helmExpect{replicas: 3}); len(problems) != 0 {
				t.Fatalf("the unbroken objects: %v", problems)
			}
			tc.mutate(objs)
			helmWantProblem(t, helmCheck(t, objs, helmExpect{replicas: 3}), tc.want)
		})
	}
}

func helmWantProblem(t *testing.T, problems []string, want string) {
	t.Helper()
	for _, p := range problems {
		if strings.Contains(p, want) {
			t.Logf("caught: %s", p)
			return
		}
	}
	t.Errorf("problems %q: want one saying %q", problems, want)
}

func helmEdit(objs []helmObj, kind string, edit func(helmObj)) {
	for _, o := range objs {
		if o.kind() == kind {
			edit(o)
		}
	}
}

// helmCopy copies objects deeply (through YAML), so that a case's changes stay its own.
func helmCopy(t *testing.T, objs []helmObj) []helmObj {
	t.Helper()
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	for _, o := range objs {
		if err := enc.Encode(o); err != nil {
			t.Fatal(err)
		}
	}
	out, err := helmDecode(buf.String())
	if err != nil {
		t.Fatal(err)
	}
	return out
}
