package deploy

// kubeconform's check without its schemas (they come from GitHub, which the tests cannot reach):
// every rendered manifest is decoded strictly into its Kubernetes API type (k8s.io/api), so a
// field the API does not have, or a value of the wrong type, fails. The ServiceMonitor (the
// Prometheus Operator's CRD, not in k8s.io/api) is checked against a minimal type of the fields
// the chart writes.

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/config"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the chart writes.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port          string         `json:"port"`
			Path          string         `json:"path"`
			Scheme        string         `json:"scheme"`
			Interval      string         `json:"interval"`
			ScrapeTimeout string         `json:"scrapeTimeout"`
			TLSConfig     map[string]any `json:"tlsConfig,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// helmK8sTypes maps apiVersion/kind to a new value of its API type.
var helmK8sTypes = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &serviceMonitor{} },
}

// helmStrict decodes every document of a rendering strictly into its type; it returns the
// problems and the ConfigMaps.
func helmStrict(text string) (problems []string, configMaps []*corev1.ConfigMap) {
	for _, doc := range strings.Split(text, "\n---\n") {
		doc = strings.TrimSpace(strings.TrimPrefix(doc, "---"))
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			problems = append(problems, fmt.Sprintf("not YAML: %v\n%s", err, doc))
			continue
		}
		if head.Kind == "" && head.APIVersion == "" {
			continue // only a comment
		}
		mk, ok := helmK8sTypes[head.APIVersion+"/"+head.Kind]
		if !ok {
			problems = append(problems, fmt.Sprintf("unknown apiVersion/kind %s %s", head.APIVersion, head.Kind))
			continue
		}
		obj := mk()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			problems = append(problems, fmt.Sprintf("%s %s: %v", head.APIVersion, head.Kind, err))
			continue
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			configMaps = append(configMaps, cm)
		}
	}
	return problems, configMaps
}

// TestHelmManifestsStrict renders the chart with several combinations of values and decodes
// every manifest strictly; the configuration in the ConfigMap also validates against sluice's
// JSON Schema.
func TestHelmManifestsStrict(t *testing.T) {
	schemaDoc, err := jsonschema.UnmarshalJSON(bytes.NewReader(config.JSONSchema()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("config.schema.json", schemaDoc); err != nil {
		t.Fatal(err)
	}
	cfgSchema, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, values string }{
		{"default", ""},
		{"options", helmOptions},
		{"sentinel", "redis: {addrs: [], sentinel: {master: m, addrs: ['s-0.s:26379'], existingSecret: s}}\n"},
		{"autoscaling", "autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 6}\n"},
		{"serviceMonitor over admin TLS", "adminToken: {enabled: false}\nadminTLS: {existingSecret: t, clientCA: true}\nserviceMonitor:\n  enabled: true\n  labels: {release: prom}\n  tlsConfig: {insecureSkipVerify: true, cert: {secret: {name: scrape, key: tls.crt}}, keySecret: {name: scrape, key: tls.key}}\n"},
		{"rls", "rls:\n  enabled: true\n  envoyConfig: {edge.yaml: 'domain: edge'}\n  quota: {domain: edge, buckets: [{name: u, match: {user: '*'}, limit: 6, period: 1m}]}\n"},
		{"networkPolicy froms", "networkPolicy:\n  proxyFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress}}}]\n  rlsFrom: [{podSelector: {matchLabels: {app: envoy}}}]\nrls: {enabled: true, envoyConfig: {edge.yaml: 'domain: edge'}}\n"},
		{"token of mine and no policy", "adminToken: {existingSecret: mine}\nnetworkPolicy: {enabled: false}\n"},
		{"one pod on the memory store", "replicaCount: 1\nredis: {addrs: []}\npodDisruptionBudget: {enabled: false}\nconfig: {upstream: 'http://a:80', store: {type: memory}}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmRun(t, "template", "sluice", helmChart, "--namespace", "edge", "-f", helmValues(t, helmRequired), "-f", helmValues(t, tc.values))
			if err != nil {
				t.Fatal(err)
			}
			problems, cms := helmStrict(out)
			for _, p := range problems {
				t.Error(p)
			}
			if len(cms) != 1 {
				t.Fatalf("%d ConfigMaps", len(cms))
			}
			var cfg any
			if err := yaml.Unmarshal([]byte(cms[0].Data["sluice.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			if err := cfgSchema.Validate(cfg); err != nil {
				t.Errorf("the rendered configuration does not validate against config.JSONSchema: %v", err)
			}
		})
	}
}

// TestHelmStrictCatches: the strict decoding refuses a field the API lacks, a value of the wrong
// type and an unknown kind.
func TestHelmStrictCatches(t *testing.T) {
	out, err := helmRun(t, "template", "sluice", helmChart, "--namespace", "edge", "-f", helmValues(t, helmRequired))
	if err != nil {
		t.Fatal(err)
	}
	if problems, _ := helmStrict(out); len(problems) != 0 {
		t.Fatalf("the default render: %v", problems)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"unknown field", "containerPort:", "containerPorts:", `unknown field "containerPorts"`},
		{"wrong type", "replicas: 3", "replicas: three", "Deployment"},
		{"unknown kind", "kind: NetworkPolicy", "kind: NetworkPolicie", "unknown apiVersion/kind networking.k8s.io/v1 NetworkPolicie"},
	} {
		if !strings.Contains(out, tc.from) {
			t.Fatalf("%s: the render has no %q", tc.name, tc.from)
		}
		problems, _ := helmStrict(strings.Replace(out, tc.from, tc.to, 1))
		if len(problems) != 1 || !strings.Contains(problems[0], tc.want) {
			t.Errorf("%s: problems %q, want one saying %q", tc.name, problems, tc.want)
		}
	}
}
