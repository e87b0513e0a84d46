package deploy

// The chart refuses what would break (issue 36): each defect of the old chart has a render
// here that the old chart let through. The refusals come from the templates (required values,
// incomplete TLS) and from values.schema.json, which embeds sluice's configuration schema.

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/chartschema"
)

// TestHelmRefusesWhatWouldBreak: values that render a chart which cannot work fail the render,
// naming the value to set.
func TestHelmRefusesWhatWouldBreak(t *testing.T) {
	const upstream = "config: {upstream: \"http://api.edge.svc:8080\"}\n"
	const redis = "redis: {addrs: [redis-master.edge:6379]}\n"
	for _, tc := range []struct {
		name   string
		values string
		set    []string // --set arguments
		want   []string // all in the error
	}{
		{"clientCA without the Secret", upstream + redis + "adminTLS: {clientCA: true}\n", nil,
			[]string{"adminTLS.clientCA needs adminTLS.existingSecret"}},
		{"no upstream", redis, nil, []string{"config.upstream is required: the URL of your API"}},
		{"upstream null", upstream + redis, []string{"config.upstream=null"}, []string{"config.upstream is required"}},
		{"upstream null in values", redis + "config: {upstream: null}\n", nil, []string{"config.upstream is required"}},
		{"the placeholder upstream", redis + "config: {upstream: \"http://my-api:8080\"}\n", nil,
			[]string{"config.upstream http://my-api:8080 is the example's placeholder"}},
		{"upstream not a string", redis + "config: {upstream: {host: api}}\n", nil, []string{"config"}},
		{"no redis", upstream, nil, []string{"redis.addrs or redis.sentinel is required"}},
		{"misspelt config field", upstream + redis + "config:\n  policies: [{name: p, algoritm: token-bucket, limit: 1, period: 1s}]\n", nil,
			[]string{"/config/policies/0", "'algoritm' not allowed"}},
		{"misspelt config section", upstream + redis + "config: {stor: {on_error: local}}\n", nil, []string{"/config", "'stor' not allowed"}},
		{"a config value outside its enum", upstream + redis + "config: {store: {on_error: fail-sometimes}}\n", nil, []string{"/config/store/on_error"}},
		{"misspelt chart value", upstream + redis + "replicaCont: 3\n", nil, []string{"'replicaCont' not allowed"}},
		{"misspelt chart value inside", upstream + redis + "adminTLS: {existingSecet: x}\n", nil, []string{"/adminTLS", "'existingSecet' not allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "sluice", helmChart, "--namespace", "edge", "-f", helmValues(t, tc.values)}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := helmRun(t, args...)
			if err == nil {
				t.Fatalf("rendered; want an error saying %q:\n%.600s", tc.want, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %v\nwant it to say %q", err, w)
				}
			}
		})
	}
}

// TestHelmAdminTokenByDefault: the default render puts a bearer token on the admin listener: a
// Secret of the chart's (32 random characters, kept on uninstall), the variable filled from it,
// admin.token_env naming it. adminToken.existingSecret takes the user's Secret instead, and
// adminToken.enabled: false leaves the token out, which NOTES.txt warns about.
func TestHelmAdminTokenByDefault(t *testing.T) {
	objs := helmMust(t, "")
	for _, p := range helmCheck(t, objs, helmExpect{replicas: 3}) { // the Secret, its variable, token_env
		t.Error(p)
	}
	secret := helmOne(objs, "Secret", "sluice-admin-token")
	if secret == nil {
		t.Fatal("no Secret sluice-admin-token")
	}
	// Another render makes another token: helm template cannot look the Secret up (documented).
	if a, b := helmStr(helmGet(secret, "data", "token")), helmStr(helmGet(helmOne(helmMust(t, ""), "Secret", "sluice-admin-token"), "data", "token")); a == b {
		t.Errorf("two renders made the same token %s: not random", a)
	}

	mine := helmMust(t, "adminToken: {existingSecret: my-token, secretKey: bearer}\n")
	for _, p := range helmCheck(t, mine, helmExpect{replicas: 3, adminToken: "my-token"}) {
		t.Error(p)
	}
	for _, e := range helmList(helmGet(helmContainer(mine), "env")) {
		if helmStr(helmGet(e, "name")) == helmTokenEnv && helmStr(helmGet(e, "valueFrom", "secretKeyRef", "key")) != "bearer" {
			t.Errorf("env %s from %v, want key bearer of my-token", helmTokenEnv, helmGet(e, "valueFrom"))
		}
	}

	off := helmMust(t, "adminToken: {enabled: false}\n")
	for _, p := range helmCheck(t, off, helmExpect{replicas: 3, adminToken: helmNoToken}) {
		t.Error(p)
	}

	if notes := helmNotes(t, ""); !strings.Contains(notes, "kubectl get secret -n edge sluice-admin-token -o jsonpath='{.data.token}' | base64 -d") ||
		!strings.Contains(notes, "set\nadminToken.existingSecret") {
		t.Errorf("NOTES.txt does not say how to read the token, or that template renders make a new one:\n%s", notes)
	}
	if notes := helmNotes(t, "adminToken: {enabled: false}\n"); !strings.Contains(notes, "WARNING: adminToken.enabled is false") {
		t.Errorf("NOTES.txt does not warn of an admin listener without a token:\n%s", notes)
	}
}

// helmNotes renders NOTES.txt (helm template leaves it out) through a copy of the chart with a
// template that includes it.
func helmNotes(t *testing.T, values string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sluice")
	if err := os.CopyFS(dir, os.DirFS(helmChart)); err != nil {
		t.Fatal(err)
	}
	show := "notes: |\n  {{- include \"sluice/templates/NOTES.txt\" . | nindent 2 }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "notes-test.yaml"), []byte(show), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helmRun(t, "template", "sluice", dir, "--namespace", "edge", "-f", helmValues(t, helmRequired), "-f", helmValues(t, values),
		"--show-only", "templates/notes-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := helmDecode(out)
	if err != nil || len(objs) != 1 {
		t.Fatalf("NOTES.txt: %v %v", err, objs)
	}
	return helmStr(objs[0]["notes"])
}

// TestHelmNetworkPolicyByDefault: the default render has a NetworkPolicy that lets only the
// monitoring namespace reach the admin and metrics ports, the proxy open.
func TestHelmNetworkPolicyByDefault(t *testing.T) {
	objs := helmMust(t, "")
	np := helmOne(objs, "NetworkPolicy", "sluice")
	if np == nil {
		t.Fatal("no NetworkPolicy by default")
	}
	from := map[string]string{}
	for _, rule := range helmList(helmGet(np, "spec", "ingress")) {
		peers := "*"
		if f := helmList(helmGet(rule, "from")); len(f) > 0 {
			peers = helmStr(helmGet(f, 0, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"))
		}
		for _, p := range helmList(helmGet(rule, "ports")) {
			from[helmStr(helmGet(p, "port"))] = peers
		}
	}
	if from["admin"] != "monitoring" || from["metrics"] != "monitoring" || from["proxy"] != "*" || len(from) != 3 {
		t.Errorf("the default NetworkPolicy lets in %v, want admin and metrics from monitoring, proxy from anyone", from)
	}
	if off := helmMust(t, "networkPolicy: {enabled: false}\n"); helmOne(off, "NetworkPolicy", "sluice") != nil {
		t.Error("networkPolicy.enabled false still renders one")
	}
}

// TestHelmValuesSchemaIsGenerated: values.schema.json is what the generator makes now from
// deploy/helm/values.schema.yaml and sluice's configuration schema.
func TestHelmValuesSchemaIsGenerated(t *testing.T) {
	part, err := os.ReadFile("helm/values.schema.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := chartschema.Generate(part)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(helmChart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/helm/sluice/values.schema.json is out of date: run go generate ./deploy/helm/gen")
	}
	// Its config is sluice's configuration schema: the repository's example refused there
	// (a misspelt field) is refused by both.
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(got))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("values.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]any{"config": map[string]any{"admin": map[string]any{"token_evn": "X"}}}
	if err := s.Validate(bad); err == nil || !strings.Contains(err.Error(), "token_evn") {
		t.Errorf("values.schema.json takes config.admin.token_evn: %v", err)
	}
	if _, err := config.Parse([]byte("upstream: http://a:80\nadmin: {token_evn: X}\n"), "sluice.yaml"); err == nil {
		t.Error("Parse takes admin.token_evn")
	}
}
