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
	"encoding/base64"
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
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

const helmChart = "helm/sluice"

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns the helm scripts/gotool.sh gives (its pinned version, cached in
// os.UserCacheDir()/sluice-helm, built with `go install` the first time, a few minutes; or the
// one HELM names): the helm scripts/release.sh packages the chart with.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = helmBuild(t) })
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

func helmBuild(t *testing.T) (string, error) {
	// Built within the test's deadline, with a clear error rather than the test binary's panic.
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-30*time.Second))
		defer cancel()
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "scripts", "gotool.sh"), "helm")
	if goCmd := filepath.Join(runtime.GOROOT(), "bin", "go"); helmExists(goCmd) {
		// The go of this test, first in the script's PATH.
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(goCmd)+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("scripts/gotool.sh helm did not finish within the test's -timeout (%s so far): give the test more time", time.Since(start).Round(time.Second))
		}
		return "", fmt.Errorf("scripts/gotool.sh helm: %v\n%s", err, stderr.String())
	}
	if s := stderr.String(); s != "" {
		t.Logf("scripts/gotool.sh helm (%s): %s", time.Since(start).Round(time.Second), s)
	}
	return strings.TrimSpace(string(out)), nil
}

func helmExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
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

// helmRequired are the values the chart requires (an upstream, a Redis): every rendering but
// helmTemplateBare's starts from them.
const helmRequired = `config: {upstream: "http://api.edge.svc:8080"}
redis: {addrs: [redis-master.edge:6379]}
`

// helmTemplate renders the chart with helmRequired and the values files, and returns its
// objects.
func helmTemplate(t *testing.T, values ...string) ([]helmObj, error) {
	t.Helper()
	return helmTemplateBare(t, append([]string{helmValues(t, helmRequired)}, values...)...)
}

// helmTemplateBare renders the chart with the values files only.
func helmTemplateBare(t *testing.T, values ...string) ([]helmObj, error) {
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
	replicas       int  // the Deployment's, or the autoscaler's minimum with autoscaling
	autoscaling    bool // a HorizontalPodAutoscaler sets the replicas
	serviceMonitor bool
	noNetPolicy    bool // networkPolicy.enabled: false (it is on by default)
	rls            bool
	secretEnvs     []string // variables filled from Secrets but the admin token's, sorted
	adminTLSSecret string   // the Secret of the admin listener's certificate, if any
	// adminToken: "" the chart's own Secret (the default), helmNoToken none, else the name of
	// adminToken.existingSecret.
	adminToken string
}

// helmNoToken is helmExpect.adminToken with adminToken.enabled: false.
const helmNoToken = "-"

// helmTokenEnv is adminToken.env's default.
const helmTokenEnv = "SLUICE_ADMIN_TOKEN"

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
	wantKinds := []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"}
	for _, k := range []struct {
		kind string
		on   bool
	}{{"ServiceMonitor", want.serviceMonitor}, {"Service", want.rls}, {"HorizontalPodAutoscaler", want.autoscaling},
		{"NetworkPolicy", !want.noNetPolicy}, {"Secret", want.adminToken == ""}} {
		if k.on {
			wantKinds = append(wantKinds, k.kind)
		}
	}
	sort.Strings(wantKinds)
	if strings.Join(kinds, ",") != strings.Join(wantKinds, ",") {
		return []string{fmt.Sprintf("rendered kinds %v, want %v", kinds, wantKinds)}
	}
	cm, dep, pdb := byKind["ConfigMap"][0], byKind["Deployment"][0], byKind["PodDisruptionBudget"][0]
	// The Services by their component: the proxy's, the admin listener's, Envoy's rate limit
	// service's.
	svcs := map[string]helmObj{}
	for _, o := range byKind["Service"] {
		svcs[helmStr(helmGet(o, "metadata", "labels", "app.kubernetes.io/component"))] = o
	}

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
	if want.autoscaling {
		// A replicas field would be reset at every upgrade, fighting the autoscaler.
		if r := helmGet(dep, "spec", "replicas"); r != nil {
			bad("Deployment: replicas %v with a HorizontalPodAutoscaler, want none", r)
		}
		hpa := byKind["HorizontalPodAutoscaler"][0]
		if helmStr(helmGet(hpa, "spec", "scaleTargetRef", "kind")) != "Deployment" || helmStr(helmGet(hpa, "spec", "scaleTargetRef", "name")) != dep.name() {
			bad("HorizontalPodAutoscaler scales %v, want Deployment %s", helmGet(hpa, "spec", "scaleTargetRef"), dep.name())
		}
		if n, _ := strconv.Atoi(helmStr(helmGet(hpa, "spec", "minReplicas"))); n != want.replicas {
			bad("HorizontalPodAutoscaler minReplicas %v, want %d", helmGet(hpa, "spec", "minReplicas"), want.replicas)
		}
	} else if n, _ := strconv.Atoi(helmStr(helmGet(dep, "spec", "replicas"))); n != want.replicas {
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
	envValues := map[string]string{}
	for _, e := range helmList(helmGet(c, "env")) {
		name := helmStr(helmGet(e, "name"))
		envs[name] = true
		envValues[name] = helmStr(helmGet(e, "value"))
		if ref := helmGet(e, "valueFrom", "secretKeyRef"); ref != nil {
			if helmStr(helmGet(ref, "name")) == "" || helmStr(helmGet(ref, "key")) == "" {
				bad("env %s: secretKeyRef without name or key", name)
			}
			secretEnvs = append(secretEnvs, name)
			t.Setenv(name, strings.Repeat("s", 64))
		}
	}
	sort.Strings(secretEnvs)
	wantSecretEnvs := slices.Clone(want.secretEnvs)
	if want.adminToken != helmNoToken {
		wantSecretEnvs = append(wantSecretEnvs, helmTokenEnv)
		sort.Strings(wantSecretEnvs)
	}
	if strings.Join(secretEnvs, ",") != strings.Join(wantSecretEnvs, ",") {
		bad("variables from Secrets %v, want %v", secretEnvs, wantSecretEnvs)
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
	// It runs with the container's GOMEMLIMIT: a value Go does not read stops any Go program.
	check := exec.Command(sluiceBinary(t), "check", "--config", filepath.Join(dir, "sluice.yaml"))
	check.Env = append(os.Environ(), "GOMEMLIMIT="+envValues["GOMEMLIMIT"])
	if out, err := check.CombinedOutput(); err != nil {
		bad("sluice check refuses the rendered configuration (GOMEMLIMIT=%s): %v\n%s", envValues["GOMEMLIMIT"], err, out)
	}
	// The admin token: the configuration's token_env, filled from the Secret (the chart's, a
	// random 32 characters, kept on uninstall; or the one named).
	if want.adminToken == helmNoToken {
		if cfg.Admin.TokenEnv != "" {
			bad("admin.token_env %s with adminToken off", cfg.Admin.TokenEnv)
		}
	} else {
		if cfg.Admin.TokenEnv != helmTokenEnv {
			bad("admin.token_env %q, want %s: the admin listener is open", cfg.Admin.TokenEnv, helmTokenEnv)
		}
		secret := want.adminToken
		if secret == "" && len(byKind["Secret"]) == 1 {
			s := byKind["Secret"][0]
			secret = s.name()
			token, err := base64.StdEncoding.DecodeString(helmStr(helmGet(s, "data", "token")))
			if err != nil || !regexp.MustCompile(`^[A-Za-z0-9]{32}$`).Match(token) {
				bad("Secret %s: token %q (%v), want 32 random letters and digits", secret, token, err)
			}
			if helmStr(helmGet(s, "metadata", "annotations", "helm.sh/resource-policy")) != "keep" {
				bad("Secret %s: no helm.sh/resource-policy: keep, an uninstall would lose the token", secret)
			}
		}
		for _, e := range helmList(helmGet(c, "env")) {
			if helmStr(helmGet(e, "name")) == helmTokenEnv {
				if got := helmStr(helmGet(e, "valueFrom", "secretKeyRef", "name")); got != secret || secret == "" {
					bad("env %s from Secret %q, want %q", helmTokenEnv, got, secret)
				}
			}
		}
		if cfg.Admin.MetricsListen == "" {
			bad("the admin token without admin.metrics_listen: Prometheus cannot scrape /metrics without the token")
		}
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
		if len(cfg.RLS.EnvoyConfig) == 0 && cfg.RLS.Quota == nil {
			bad("rls without envoy_config files or quota")
		}
	}

	// Probes: on the admin port that the configuration listens on. Readiness is /readyz (the
	// store decides) only where a pod without its store refuses anyway: with fail-open and local,
	// a Redis outage would take every pod out of the Service at once.
	readyPath := "/readyz"
	if cfg.Store.OnError == sluice.FailOpen || cfg.Store.OnError == sluice.FailLocal {
		readyPath = "/healthz"
	}
	for _, p := range []struct{ field, path string }{{"readinessProbe", readyPath}, {"livenessProbe", "/healthz"}} {
		get := helmGet(c, p.field, "httpGet")
		if got := helmStr(helmGet(get, "path")); got != p.path {
			bad("%s path %q, want %s", p.field, got, p.path)
		}
		if got := resolve(helmGet(get, "port")); got != admin {
			bad("%s on port %v (%d), but admin_listen is %s", p.field, helmGet(get, "port"), got, cfg.AdminListen)
		}
	}

	// The Services: every port reaches a container port. The proxy's holds the proxy port alone
	// (a LoadBalancer publishes all it holds); the admin listener's (and the metrics port) and
	// Envoy's rate limit service's are ClusterIP: neither is for outside the cluster.
	metricsPort := admin
	if cfg.Admin.MetricsListen != "" {
		metricsPort = listenPort("admin.metrics_listen", cfg.Admin.MetricsListen)
		if metricsPort != ports["metrics"] {
			bad("admin.metrics_listen %s, but the container's metrics port is %d", cfg.Admin.MetricsListen, ports["metrics"])
		}
	}
	svcPorts := map[string]map[string]int{} // component → Service port name → the container port it reaches
	for _, sv := range []struct {
		component string
		want      map[string]int
		served    bool
	}{
		{"proxy", map[string]int{"proxy": ports["proxy"]}, true},
		{"admin", map[string]int{"admin": admin, "metrics": metricsPort}, true},
		{"rls", map[string]int{"grpc-rls": ports["grpc-rls"]}, want.rls},
	} {
		svc, ok := svcs[sv.component]
		if ok != sv.served {
			bad("Service of component %s: %v, want %v", sv.component, ok, sv.served)
			continue
		}
		if !ok {
			continue
		}
		selects("Service "+svc.name(), helmGet(svc, "spec", "selector"))
		if typ := helmStr(helmGet(svc, "spec", "type")); sv.component != "proxy" && typ != "ClusterIP" {
			bad("Service %s (%s) is of type %s, want ClusterIP", svc.name(), sv.component, typ)
		}
		got := map[string]int{}
		for _, p := range helmList(helmGet(svc, "spec", "ports")) {
			name, target := helmStr(helmGet(p, "name")), helmGet(p, "targetPort")
			if target == nil {
				target = helmGet(p, "port")
			}
			n := resolve(target)
			if n < 0 || !helmHasPort(ports, n) {
				bad("Service port %s: targetPort %v is no container port (%v)", name, target, ports)
			}
			got[name] = n
		}
		if sv.component == "admin" && metricsPort == admin {
			delete(sv.want, "metrics")
		}
		if !maps.Equal(got, sv.want) {
			bad("Service %s (%s) ports %v, want %v", svc.name(), sv.component, got, sv.want)
		}
		svcPorts[sv.component] = got
	}

	// Prometheus: the pods' annotations and the ServiceMonitor scrape /metrics on the metrics
	// port when there is one, else on the admin port, over HTTPS when that has admin.tls.
	scheme := "http"
	if cfg.Admin.MetricsListen == "" && cfg.Admin.TLS != nil {
		scheme = "https"
	}
	ann, _ := helmGet(pod, "metadata", "annotations").(map[string]any)
	if helmStr(ann["prometheus.io/scrape"]) != "true" || helmStr(ann["prometheus.io/path"]) != "/metrics" ||
		helmStr(ann["prometheus.io/port"]) != strconv.Itoa(metricsPort) || helmStr(ann["prometheus.io/scheme"]) != scheme {
		bad("prometheus annotations scrape=%v port=%v scheme=%v path=%v, want true %d %s /metrics",
			ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/scheme"], ann["prometheus.io/path"], metricsPort, scheme)
	}
	if len(helmStr(ann["checksum/config"])) != 2*sha256.Size {
		bad("no checksum/config annotation: a configuration change would not roll the pods")
	}
	if want.serviceMonitor {
		sm := byKind["ServiceMonitor"][0]
		for comp, svc := range svcs {
			l, _ := helmGet(svc, "metadata", "labels").(map[string]any)
			matches := true
			for k, v := range helmGet(sm, "spec", "selector", "matchLabels").(map[string]any) {
				matches = matches && helmStr(l[k]) == helmStr(v)
			}
			if matches != (comp == "admin") {
				bad("ServiceMonitor selects Service %s (%s): %v, want the admin Service alone", svc.name(), comp, matches)
			}
		}
		ep := helmGet(sm, "spec", "endpoints", 0)
		if n, ok := svcPorts["admin"][helmStr(helmGet(ep, "port"))]; !ok || n != metricsPort || helmStr(helmGet(ep, "path")) != "/metrics" ||
			helmStr(helmGet(ep, "scheme")) != scheme {
			bad("ServiceMonitor scrapes port %v scheme %v path %v, want the admin Service's port of %d, %s, /metrics",
				helmGet(ep, "port"), helmGet(ep, "scheme"), helmGet(ep, "path"), metricsPort, scheme)
		}
		if tc := helmGet(ep, "tlsConfig"); (tc != nil) != (scheme == "https") {
			bad("ServiceMonitor tlsConfig %v with scheme %s", tc, scheme)
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
		if pct, ok := strings.CutSuffix(helmStr(minAvail), "%"); ok {
			if n, err := strconv.Atoi(pct); err != nil || n >= 100 {
				bad("PodDisruptionBudget minAvailable %v blocks every disruption", minAvail)
			}
		} else if n, err := strconv.Atoi(helmStr(minAvail)); err != nil || n >= want.replicas {
			bad("PodDisruptionBudget minAvailable %v with %d replicas blocks every disruption", minAvail, want.replicas)
		}
	default:
		if n, err := strconv.Atoi(strings.TrimSuffix(helmStr(maxUnavail), "%")); err != nil || n < 1 {
			bad("PodDisruptionBudget maxUnavailable %v blocks every disruption", maxUnavail)
		}
	}

	// Shutdown: the preStop sleep, or sluice's own server.shutdown_delay, keeps the pod serving
	// while its endpoints go (without either, sluice closes its listeners at SIGTERM), and the
	// grace covers them and server.drain_timeout, or SIGKILL cuts the requests in flight.
	sleep, _ := strconv.Atoi(helmStr(helmGet(c, "lifecycle", "preStop", "sleep", "seconds")))
	if sleep < 1 && cfg.Server.ShutdownDelay <= 0 {
		bad("no preStop sleep: sluice stops listening at SIGTERM while the Service still sends it requests")
	}
	grace, _ := strconv.Atoi(helmStr(helmGet(pod, "spec", "terminationGracePeriodSeconds")))
	if need := time.Duration(sleep)*time.Second + cfg.Server.ShutdownDelay + cfg.Server.DrainTimeout; time.Duration(grace)*time.Second <= need {
		bad("terminationGracePeriodSeconds %d, want more than the preStop sleep (%ds) and server.drain_timeout (%s)", grace, sleep, cfg.Server.DrainTimeout)
	}

	// GOMEMLIMIT: below the memory limit (the runtime read it above), not far below.
	if limit := helmBytes(helmStr(helmGet(c, "resources", "limits", "memory"))); limit > 0 {
		n, err := strconv.ParseInt(envValues["GOMEMLIMIT"], 10, 64)
		if err != nil || n >= limit || n < limit*8/10 {
			bad("GOMEMLIMIT %q with a memory limit of %d bytes: want 80-100%% of it", envValues["GOMEMLIMIT"], limit)
		}
	}

	// Its own ServiceAccount, without a token in the pod.
	if sa := byKind["ServiceAccount"][0]; helmStr(helmGet(pod, "spec", "serviceAccountName")) != sa.name() ||
		helmGet(sa, "automountServiceAccountToken") != false || helmGet(pod, "spec", "automountServiceAccountToken") != false {
		bad("pods run as %v (token %v), want ServiceAccount %s without its token (%v)", helmGet(pod, "spec", "serviceAccountName"),
			helmGet(pod, "spec", "automountServiceAccountToken"), sa.name(), helmGet(sa, "automountServiceAccountToken"))
	}

	// Spread across nodes and zones, as a preference.
	spread := map[string]bool{}
	for i, tsc := range helmList(helmGet(pod, "spec", "topologySpreadConstraints")) {
		selects(fmt.Sprintf("topologySpreadConstraints[%d]", i), helmGet(tsc, "labelSelector", "matchLabels"))
		spread[helmStr(helmGet(tsc, "topologyKey"))+" "+helmStr(helmGet(tsc, "whenUnsatisfiable"))] = true
	}
	if !spread["kubernetes.io/hostname ScheduleAnyway"] || !spread["topology.kubernetes.io/zone ScheduleAnyway"] {
		bad("topologySpreadConstraints %v: want the pods spread across nodes and zones, ScheduleAnyway", spread)
	}

	// The NetworkPolicy: selects the pods; the proxy (and rls) ports open; the admin port (and the
	// metrics port) only to peers named.
	if !want.noNetPolicy {
		np := byKind["NetworkPolicy"][0]
		selects("NetworkPolicy", helmGet(np, "spec", "podSelector", "matchLabels"))
		open := map[string]bool{}
		for _, rule := range helmList(helmGet(np, "spec", "ingress")) {
			for _, p := range helmList(helmGet(rule, "ports")) {
				name := helmStr(helmGet(p, "port"))
				if resolve(name) < 0 {
					bad("NetworkPolicy port %s is no container port (%v)", name, ports)
				}
				if (name == "admin" || name == "metrics") && len(helmList(helmGet(rule, "from"))) == 0 {
					bad("NetworkPolicy opens port %s to anyone", name)
				}
				open[name] = true
			}
		}
		for name := range ports {
			if !open[name] {
				bad("NetworkPolicy leaves port %s closed to everyone", name)
			}
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

// helmBytes reads a memory quantity of the forms the chart's values use (268435456, 256Mi, 1Gi,
// 500M); 0 for any other.
func helmBytes(q string) int64 {
	for _, u := range []struct {
		suffix string
		n      float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"", 1}} {
		if num, ok := strings.CutSuffix(q, u.suffix); ok {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0
			}
			return int64(f * u.n)
		}
	}
	return 0
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
			if s, ok := x.(string); ok && (k == "password_env" || k == "secret_env" || k == "token_env") {
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
			args := []string{"lint", helmChart, "-f", helmValues(t, helmRequired)}
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
		{"replicas without redis", "redis: {addrs: []}\n", "redis.addrs or redis.sentinel is required"},
		{"memory store on replicas", "redis: {addrs: []}\nconfig: {upstream: http://api:80, store: {type: memory}}\n", "config.store.type: memory needs replicaCount: 1 and autoscaling.enabled: false"},
		{"memory store autoscaled", "replicaCount: 1\nautoscaling: {enabled: true}\nredis: {addrs: []}\nconfig: {upstream: http://api:80, store: {type: memory}}\n", "config.store.type: memory needs replicaCount: 1 and autoscaling.enabled: false"},
		{"memory store and redis", "replicaCount: 1\nconfig: {upstream: http://api:80, store: {type: memory}}\n", "config.store.type: memory and redis.addrs/redis.sentinel exclude each other"},
		{"token without a variable", "adminToken: {env: \"\"}\n", "adminToken.env is required"},
		{"config.rls", "config: {upstream: http://api:80, rls: {listen: 0.0.0.0:1}}\n", "config.rls: set rls.enabled"},
		{"config.admin.tls", "config: {upstream: http://api:80, admin: {tls: {cert_file: a, key_file: b}}}\n", "config.admin.tls: set adminTLS.existingSecret"},
		{"ServiceMonitor over mTLS without a client certificate", "adminToken: {enabled: false}\nadminTLS: {existingSecret: t, clientCA: true}\nserviceMonitor: {enabled: true}\n", "serviceMonitor.tlsConfig needs cert and keySecret"},
		{"config.tls", "config: {upstream: http://api:80, tls: {cert_file: a, key_file: b}}\n", "config.tls: the chart mounts no certificate for the proxy"},
		{"minAvailable = replicas", "podDisruptionBudget: {maxUnavailable: null, minAvailable: 3}\n", "minAvailable must be less than replicaCount"},
		{"maxUnavailable 0", "podDisruptionBudget: {maxUnavailable: 0}\n", "maxUnavailable must be at least 1"},
		{"rls without files", "rls: {enabled: true}\n", "rls.enabled needs rls.envoyConfig (at least one envoyproxy/ratelimit file) or rls.quota"},
		{"both budget fields", "podDisruptionBudget: {minAvailable: 1, maxUnavailable: 1}\n", "set minAvailable or maxUnavailable, not both"},
		{"minAvailable 100%", "podDisruptionBudget: {minAvailable: 100%}\n", "minAvailable must be less than 100%"},
		{"minAvailable = autoscaling's minimum", "autoscaling: {enabled: true, minReplicas: 2}\npodDisruptionBudget: {minAvailable: 2}\n", "minAvailable must be less than replicaCount (autoscaling.minReplicas"},
		{"autoscaling max below min", "autoscaling: {enabled: true, minReplicas: 4, maxReplicas: 3}\n", "autoscaling.maxReplicas must be at least autoscaling.minReplicas"},
		{"grace shorter than the drain", "terminationGracePeriodSeconds: 30\n", "terminationGracePeriodSeconds 30 is shorter than lifecycle.preStopSleepSeconds (10) and server.drain_timeout (30s)"},
		{"memory limit unread", "resources: {limits: {cpu: 1, memory: lots}}\n", `resources.limits.memory "lots": not a quantity`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, helmValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// One replica may use the memory store, asked for by name.
	objs, err := helmTemplate(t, helmValues(t, "replicaCount: 1\nredis: {addrs: []}\npodDisruptionBudget: {maxUnavailable: 1}\nconfig: {upstream: http://api:80, store: {type: memory}}\n"))
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
			// A Redis outage would take every pod out of the Service, though each still answers.
			{"readiness on /readyz with on_error local", "probes: {readinessPath: /readyz}\nconfig: {upstream: http://api:80, store: {on_error: local}}\n",
				`readinessProbe path "/readyz", want /healthz`},
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
		{"admin port on the proxy's Service", func(objs []helmObj) {
			helmEdit(objs, "Service", func(o helmObj) {
				if o.name() == "sluice" {
					spec := helmGet(o, "spec").(map[string]any)
					spec["ports"] = append(helmList(spec["ports"]), map[string]any{"name": "admin", "port": 9090, "targetPort": "admin"})
				}
			})
		}, `Service sluice (proxy) ports map[admin:9090 proxy:8080], want map[proxy:8080]`},
		{"admin Service published", func(objs []helmObj) {
			helmEdit(objs, "Service", func(o helmObj) {
				if o.name() == "sluice-admin" {
					helmGet(o, "spec").(map[string]any)["type"] = "LoadBalancer"
				}
			})
		}, "Service sluice-admin (admin) is of type LoadBalancer, want ClusterIP"},
		{"no preStop sleep", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				delete(helmGet(o, "spec", "template", "spec", "containers", 0).(map[string]any), "lifecycle")
			})
		}, "no preStop sleep"},
		{"grace within the drain", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "spec").(map[string]any)["terminationGracePeriodSeconds"] = 30
			})
		}, "terminationGracePeriodSeconds 30, want more than the preStop sleep (10s) and server.drain_timeout (30s)"},
		{"GOMEMLIMIT Go does not read", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "spec", "containers", 0, "env", 0).(map[string]any)["value"] = "241591910 bytes"
			})
		}, "sluice check refuses the rendered configuration (GOMEMLIMIT=241591910 bytes)"},
		{"GOMEMLIMIT at the limit", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "spec", "containers", 0, "env", 0).(map[string]any)["value"] = "268435456"
			})
		}, `GOMEMLIMIT "268435456" with a memory limit of 268435456 bytes`},
		{"token mounted", func(objs []helmObj) {
			helmEdit(objs, "ServiceAccount", func(o helmObj) { o["automountServiceAccountToken"] = true })
		}, "without its token (true)"},
		{"spread that leaves pods pending", func(objs []helmObj) {
			helmEdit(objs, "Deployment", func(o helmObj) {
				helmGet(o, "spec", "template", "spec", "topologySpreadConstraints", 1).(map[string]any)["whenUnsatisfiable"] = "DoNotSchedule"
			})
		}, "want the pods spread across nodes and zones, ScheduleAnyway"},
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

// helmOne is the rendered object of the kind and name, or nil.
func helmOne(objs []helmObj, kind, name string) helmObj {
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	return nil
}

// helmMust renders the chart with values and fails the test if it does not render.
func helmMust(t *testing.T, values string) []helmObj {
	t.Helper()
	objs, err := helmTemplate(t, helmValues(t, values))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// helmContainer is the Deployment's container.
func helmContainer(objs []helmObj) any {
	return helmGet(helmOne(objs, "Deployment", "sluice"), "spec", "template", "spec", "containers", 0)
}

// TestHelmServices: a LoadBalancer publishes the proxy and nothing else; the admin listener (the
// decision API, the operator page, /metrics) and Envoy's rate limit service (which spends any
// client's limits for whoever names its descriptors) have ClusterIP Services of their own.
func TestHelmServices(t *testing.T) {
	objs := helmMust(t, "service: {type: LoadBalancer}\nrls: {enabled: true, envoyConfig: {edge.yaml: 'domain: edge'}}\n")
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3, rls: true}) {
		t.Error(p)
	}
	for name, want := range map[string]struct{ typ, ports string }{
		"sluice": {"LoadBalancer", "proxy"}, "sluice-admin": {"ClusterIP", "admin,metrics"}, "sluice-rls": {"ClusterIP", "grpc-rls"},
	} {
		svc := helmOne(objs, "Service", name)
		var ports []string
		for _, p := range helmList(helmGet(svc, "spec", "ports")) {
			ports = append(ports, helmStr(helmGet(p, "name")))
		}
		if typ := helmStr(helmGet(svc, "spec", "type")); typ != want.typ || strings.Join(ports, ",") != want.ports {
			t.Errorf("Service %s: %s with ports %v, want %s with %s", name, typ, ports, want.typ, want.ports)
		}
	}
}

// TestHelmQuota: rls.quota alone serves the quota service on the rls port (its own ClusterIP
// Service), the section passed to sluice's configuration as written, no envoy_config.
func TestHelmQuota(t *testing.T) {
	objs := helmMust(t, "redis: {addrs: [redis:6379]}\nrls:\n  enabled: true\n  quota:\n    domain: edge\n    buckets: [{name: per-user, match: {name: api, user: \"*\"}, limit: 600, period: 1m}]\n")
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3, rls: true}) {
		t.Error(p)
	}
	cm := helmOne(objs, "ConfigMap", "sluice")
	cfg, err := config.Parse([]byte(helmStr(helmGet(cm, "data", "sluice.yaml"))), filepath.Join(t.TempDir(), "sluice.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.RLS.Quota; q == nil || q.Domain != "edge" || len(q.Buckets) != 1 || q.Buckets[0].Match["user"] != "*" || len(cfg.RLS.EnvoyConfig) != 0 {
		t.Fatalf("rls %+v, quota %+v; want the quota section as written, no files", cfg.RLS, q)
	}
}

// TestHelmNetworkPolicy: the admin and metrics ports are open to the monitoring namespace only,
// the proxy port to the namespaces named, the rls port to anyone.
func TestHelmNetworkPolicy(t *testing.T) {
	objs := helmMust(t, `networkPolicy:
  enabled: true
  proxyFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress}}}]
rls: {enabled: true, envoyConfig: {edge.yaml: 'domain: edge'}}
config: {upstream: http://api:80, admin: {metrics_listen: on}}
`)
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3, rls: true}) {
		t.Error(p)
	}
	from := map[string]string{} // port → the namespaces allowed, "*" for anyone
	for _, rule := range helmList(helmGet(helmOne(objs, "NetworkPolicy", "sluice"), "spec", "ingress")) {
		peers := "*"
		if f := helmList(helmGet(rule, "from")); len(f) > 0 {
			peers = helmStr(helmGet(f, 0, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"))
		}
		for _, p := range helmList(helmGet(rule, "ports")) {
			from[helmStr(helmGet(p, "port"))] = peers
		}
	}
	want := map[string]string{"proxy": "ingress", "grpc-rls": "*", "admin": "monitoring", "metrics": "monitoring"}
	if !maps.Equal(from, want) {
		t.Errorf("NetworkPolicy lets in %v, want %v", from, want)
	}
	open := helmCopy(t, objs)
	helmEdit(open, "NetworkPolicy", func(o helmObj) {
		for _, rule := range helmList(helmGet(o, "spec", "ingress")) {
			delete(rule.(map[string]any), "from")
		}
	})
	helmWantProblem(t, helmCheck(t, open, helmExpect{replicas: 3, rls: true}), "NetworkPolicy opens port admin to anyone")
}

// TestHelmScrape: Prometheus reads /metrics where it is served to it: the metrics_listen port
// (plain) when there is one, which the admin token (on by default) implies, else the admin port,
// over HTTPS (with the ServiceMonitor's tlsConfig) when that has adminTLS, in the pod, the admin
// Service, the annotations and the ServiceMonitor.
func TestHelmScrape(t *testing.T) {
	for _, tc := range []struct{ name, values, port, scheme string }{
		{"default", "", "9100", "http"},
		{"no token", "adminToken: {enabled: false}\n", "9090", "http"},
		{"admin TLS", "adminTLS: {existingSecret: sluice-admin-tls}\n", "9100", "http"},
		{"admin TLS without the token", "adminToken: {enabled: false}\nadminTLS: {existingSecret: sluice-admin-tls}\n", "9090", "https"},
		{"admin TLS and metrics_listen", "adminTLS: {existingSecret: sluice-admin-tls, clientCA: true}\nconfig: {upstream: http://api:80, admin: {metrics_listen: 127.0.0.1:1}}\n", "9100", "http"},
		{"metrics_listen", "ports: {metrics: 9300}\nconfig: {upstream: http://api:80, admin: {metrics_listen: on}}\n", "9300", "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := helmMust(t, tc.values+"serviceMonitor: {enabled: true}\n")
			want := helmExpect{replicas: 3, serviceMonitor: true}
			if strings.Contains(tc.values, "adminTLS") {
				want.adminTLSSecret = "sluice-admin-tls"
			}
			if strings.Contains(tc.values, "adminToken: {enabled: false}") {
				want.adminToken = helmNoToken
			}
			for _, p := range helmCheck(t, objs, want) {
				t.Error(p)
			}
			ann := helmGet(helmOne(objs, "Deployment", "sluice"), "spec", "template", "metadata", "annotations")
			ep := helmGet(helmOne(objs, "ServiceMonitor", "sluice"), "spec", "endpoints", 0)
			if helmStr(helmGet(ann, "prometheus.io/port")) != tc.port || helmStr(helmGet(ann, "prometheus.io/scheme")) != tc.scheme ||
				helmStr(helmGet(ep, "scheme")) != tc.scheme {
				t.Errorf("annotations %v, ServiceMonitor %v: want port %s, %s", ann, ep, tc.port, tc.scheme)
			}
			if tc.scheme == "https" && helmGet(ep, "tlsConfig", "insecureSkipVerify") != true {
				t.Errorf("ServiceMonitor tlsConfig %v, want the values' (insecureSkipVerify)", helmGet(ep, "tlsConfig"))
			}
			// Caught: a ServiceMonitor that selects every Service of the release.
			wide := helmCopy(t, objs)
			helmEdit(wide, "ServiceMonitor", func(o helmObj) {
				delete(helmGet(o, "spec", "selector", "matchLabels").(map[string]any), "app.kubernetes.io/component")
			})
			helmWantProblem(t, helmCheck(t, wide, want), "ServiceMonitor selects Service sluice (proxy): true")
		})
	}
}

// TestHelmReadinessFollowsOnError: where a pod without its store still answers (fail-open,
// local), readiness is /healthz, so that a Redis outage does not empty the Service; with
// fail-closed it is /readyz; probes.readinessPath overrides.
func TestHelmReadinessFollowsOnError(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"config: {upstream: http://api:80, store: {on_error: local}}\n", "/healthz"},
		{"config: {upstream: http://api:80, store: {on_error: fail-open}}\n", "/healthz"},
		{"config: {upstream: http://api:80, store: {on_error: fail-closed}}\n", "/readyz"},
		{"config: {upstream: http://api:80}\n", "/readyz"},
		{"probes: {readinessPath: /readyz}\nconfig: {upstream: http://api:80, store: {on_error: local}}\n", "/readyz"},
	} {
		objs := helmMust(t, tc.values)
		if got := helmStr(helmGet(helmContainer(objs), "readinessProbe", "httpGet", "path")); got != tc.want {
			t.Errorf("%s: readiness %s, want %s", strings.TrimSpace(tc.values), got, tc.want)
		}
	}
}

// TestHelmShutdown: the pod sleeps before SIGTERM (it stays in the endpoints a moment after it
// starts terminating), and its grace covers the sleep and sluice's drain.
func TestHelmShutdown(t *testing.T) {
	for _, tc := range []struct {
		values       string
		sleep, grace int
	}{
		{"", 10, 45},
		{"config: {upstream: http://api:80, server: {drain_timeout: 1m30s}}\n", 10, 105},
		{"lifecycle: {preStopSleepSeconds: 3}\nconfig: {upstream: http://api:80, server: {drain_timeout: 500ms}}\n", 3, 9},
		{"terminationGracePeriodSeconds: 120\n", 10, 120},
		{"lifecycle: {preStopSleepSeconds: 0}\n", 0, 35},
		// An older cluster: no preStop sleep, sluice's own delay instead.
		{"lifecycle: {preStopSleepSeconds: 0}\nconfig: {upstream: http://api:80, server: {shutdown_delay: 10s}}\n", 0, 45},
	} {
		objs := helmMust(t, tc.values)
		c := helmContainer(objs)
		sleep, _ := strconv.Atoi(helmStr(helmGet(c, "lifecycle", "preStop", "sleep", "seconds")))
		grace, _ := strconv.Atoi(helmStr(helmGet(helmOne(objs, "Deployment", "sluice"), "spec", "template", "spec", "terminationGracePeriodSeconds")))
		if sleep != tc.sleep || grace != tc.grace {
			t.Errorf("%q: preStop sleep %d, grace %d; want %d, %d", tc.values, sleep, grace, tc.sleep, tc.grace)
		}
		if tc.sleep > 0 || strings.Contains(tc.values, "shutdown_delay") {
			for _, p := range helmCheck(t, objs, helmExpect{replicas: 3}) {
				t.Errorf("%q: %s", tc.values, p)
			}
		}
	}
}

// TestHelmGoMemLimit: GOMEMLIMIT is goMemLimitPercent of the memory limit in bytes (a value the
// Go runtime reads: helmCheck runs sluice with it), and absent without a limit or with 0.
func TestHelmGoMemLimit(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"", "241591910"}, // 90% of 256Mi
		{"resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 1, memory: 1Gi}}\ngoMemLimitPercent: 80\n", "858993459"},
		{"resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 1, memory: 500M}}\n", "450000000"},
		{"resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 1, memory: 0.5Gi}}\n", "483183820"},
		{"goMemLimitPercent: 0\n", ""},
	} {
		objs := helmMust(t, tc.values)
		got := ""
		for _, e := range helmList(helmGet(helmContainer(objs), "env")) {
			if helmStr(helmGet(e, "name")) == "GOMEMLIMIT" {
				got = helmStr(helmGet(e, "value"))
			}
		}
		if got != tc.want {
			t.Errorf("%q: GOMEMLIMIT %q, want %q", tc.values, got, tc.want)
		}
		if tc.want != "" {
			for _, p := range helmCheck(t, objs, helmExpect{replicas: 3}) {
				t.Errorf("%q: %s", tc.values, p)
			}
		}
	}
}

// TestHelmAutoscaling: with autoscaling the HorizontalPodAutoscaler owns the replicas (the
// Deployment sets none, or every upgrade would reset them), and the disruption budget is checked
// against its minimum.
func TestHelmAutoscaling(t *testing.T) {
	objs := helmMust(t, "autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 6, targetCPUUtilizationPercentage: 60}\npodDisruptionBudget: {minAvailable: 1}\n")
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 2, autoscaling: true}) {
		t.Error(p)
	}
	hpa := helmOne(objs, "HorizontalPodAutoscaler", "sluice")
	if helmStr(helmGet(hpa, "spec", "maxReplicas")) != "6" || helmStr(helmGet(hpa, "spec", "metrics", 0, "resource", "target", "averageUtilization")) != "60" {
		t.Errorf("HorizontalPodAutoscaler spec %v: want up to 6 replicas at 60%% CPU", helmGet(hpa, "spec"))
	}
}

// TestHelmDisruptionBudget: minAvailable or maxUnavailable, each set alone as the values' comment
// says (no null for the other), numbers or percentages; neither is maxUnavailable 1.
func TestHelmDisruptionBudget(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"", "maxUnavailable=1"},
		{"podDisruptionBudget: {minAvailable: 2}\n", "minAvailable=2"},
		{"podDisruptionBudget: {maxUnavailable: 2}\n", "maxUnavailable=2"},
		{"podDisruptionBudget: {minAvailable: 50%}\n", "minAvailable=50%"},
		{"podDisruptionBudget: {maxUnavailable: 34%}\n", "maxUnavailable=34%"},
	} {
		objs := helmMust(t, tc.values)
		spec, _ := helmGet(helmOne(objs, "PodDisruptionBudget", "sluice"), "spec").(map[string]any)
		var got []string
		for _, k := range []string{"minAvailable", "maxUnavailable"} {
			if v, ok := spec[k]; ok {
				got = append(got, k+"="+helmStr(v))
			}
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%q: PodDisruptionBudget %v, want %s", tc.values, got, tc.want)
		}
		for _, p := range helmCheck(t, objs, helmExpect{replicas: 3}) {
			t.Errorf("%q: %s", tc.values, p)
		}
	}
}

// helmSemver is a release's version as the chart's appVersion and the image's tag carry it: 1.2.3,
// without the git tag's v (a release publishes ghcr.io/sluicehq/sluice:1.2.3).
var helmSemver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// TestHelmDefaultImageIsTheRelease: the chart's default image is the one a release publishes at
// its appVersion, ghcr.io/sluicehq/sluice:<appVersion>; image.tag and image.repository override it.
func TestHelmDefaultImageIsTheRelease(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(helmChart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil {
		t.Fatal(err)
	}
	if !helmSemver.MatchString(meta.AppVersion) {
		t.Errorf("appVersion %q is not a release's version (1.2.3, no v): a release publishes no image so tagged", meta.AppVersion)
	}
	if image, want := helmStr(helmGet(helmContainer(helmMust(t, "")), "image")), "ghcr.io/sluicehq/sluice:"+meta.AppVersion; image != want {
		t.Errorf("the chart's default image %s, want %s", image, want)
	}
	if image := helmStr(helmGet(helmContainer(helmMust(t, "image: {repository: registry.example.com/sluice, tag: dev}\n")), "image")); image != "registry.example.com/sluice:dev" {
		t.Errorf("image.repository and image.tag: image %s, want registry.example.com/sluice:dev", image)
	}
}
