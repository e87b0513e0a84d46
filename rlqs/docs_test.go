package rlqs_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/config"
)

// The types the documented Envoy configuration names in its typed_configs, registered by these
// imports for protojson.
var (
	_ = routerv3.Router{}
	_ = httpv3.HttpProtocolOptions{}
	_ = matcherv3.HttpRequestHeaderMatchInput{}
)

type validator interface{ ValidateAll() error }

// TestEnvoyDocsConfig: docs/envoy.md's RLQS section gives a sluice configuration and a complete
// Envoy configuration. sluice's parses (with a quota section of the rules shown); Envoy's decodes
// into Envoy's bootstrap proto (every typed_config a known type, every field a real one) and
// passes the protos' own validation, the filter's, its bucket settings' and the HTTP/2 options' too.
func TestEnvoyDocsConfig(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)
	i := strings.Index(sec, "## Quota by demand")
	if i < 0 {
		t.Fatal("docs/envoy.md has no RLQS section")
	}
	sec = sec[i:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	var sluiceYAML, envoyYAML string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(sec, -1) {
		switch {
		case strings.HasPrefix(m[1], "# sluice.yaml"):
			sluiceYAML = m[1]
		case strings.HasPrefix(m[1], "# envoy.yaml"):
			envoyYAML = m[1]
		}
	}
	if sluiceYAML == "" || envoyYAML == "" {
		t.Fatal("the RLQS section lacks its sluice.yaml or envoy.yaml block")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(sluiceYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("the documented sluice.yaml: %v", err)
	}
	q := cfg.RLS.Quota
	if q == nil || q.Domain != "edge" || len(q.Buckets) != 3 || q.Buckets[0].Match["user"] != "*" {
		t.Fatalf("the documented quota section read as %+v", q)
	}

	var y any
	if err := yaml.Unmarshal([]byte(envoyYAML), &y); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("the documented envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	check := func(what string, m proto.Message) {
		t.Helper()
		if err := m.(validator).ValidateAll(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	unpack := func(what string, a *anypb.Any, m proto.Message) {
		t.Helper()
		if err := a.UnmarshalTo(m); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		check(what, m)
	}
	check("bootstrap", &b)
	var hcm hcmv3.HttpConnectionManager
	unpack("http_connection_manager", b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
	var filter rlqsv3.RateLimitQuotaFilterConfig
	unpack("rate_limit_quota", hcm.GetHttpFilters()[0].GetTypedConfig(), &filter)
	if filter.GetDomain() != q.Domain || filter.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "sluice_rlqs" {
		t.Errorf("the filter's domain %q and cluster %q; want sluice's %q and sluice_rlqs", filter.GetDomain(), filter.GetRlqsServer().GetEnvoyGrpc().GetClusterName(), q.Domain)
	}
	var ms []*xdsmatcher.Matcher_MatcherList_FieldMatcher
	ms = filter.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(ms) == 0 {
		t.Fatal("no bucket matchers")
	}
	var settings rlqsv3.RateLimitQuotaBucketSettings
	unpack("bucket settings", ms[0].GetOnMatch().GetAction().GetTypedConfig(), &settings)
	ids := settings.GetBucketIdBuilder().GetBucketIdBuilder()
	if ids["name"].GetStringValue() != "api" || ids["user"].GetCustomValue() == nil || len(ids) != len(q.Buckets[0].Match) {
		t.Errorf("the bucket id built %v does not match sluice's rule %v", ids, q.Buckets[0].Match)
	}
	if settings.GetNoAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket() == nil || settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket() == nil {
		t.Error("the documented filter must set both fallbacks to token buckets, as the failure section says")
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "sluice_rlqs" {
			continue
		}
		var opts httpv3.HttpProtocolOptions
		unpack("sluice_rlqs's protocol options", c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &opts)
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Error("sluice_rlqs must speak HTTP/2 (gRPC)")
		}
	}
}
