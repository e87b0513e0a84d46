package envoyconf

import (
	"strconv"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/config"
)

// FromProto reads RateLimitConfig resources (what an xDS management server sends, one per
// domain) into one Config, as the reference reads them: each becomes the document its YAML file
// would be (the fields the proto has: key, value, rate_limit, descriptors, shadow_mode,
// detailed_metric), checked exactly as a file is, then the domains are combined as Load combines
// files (a domain in two resources is an error). Errors name the resource ("xds:NAME", or the
// domain when the resource has no name) and the descriptor, without lines.
func FromProto(rs ...*rlsconfpb.RateLimitConfig) (*Config, error) {
	var errs config.Errors
	var cfgs []*Config
	for i, r := range rs {
		name := r.GetName()
		if name == "" {
			name = r.GetDomain()
		}
		if name == "" {
			name = "resource " + strconv.Itoa(i)
		}
		p := &parser{file: "xds:" + name}
		d := p.document(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{protoDoc(r)}})
		if len(p.errs) > 0 {
			errs = append(errs, finish(p.errs)...)
			continue
		}
		finishDomain(d)
		cfgs = append(cfgs, &Config{domains: map[string]*domain{d.name: d}, warnings: finish(p.warns)})
	}
	return mergeAll(cfgs, errs)
}

// protoDoc is r as the YAML document of its file.
func protoDoc(r *rlsconfpb.RateLimitConfig) *yaml.Node {
	m := ymap("domain", ystr(r.GetDomain()))
	if ds := r.GetDescriptors(); len(ds) > 0 {
		m.Content = append(m.Content, ystr("descriptors"), protoDescriptors(ds))
	}
	return m
}

func protoDescriptors(ds []*rlsconfpb.RateLimitDescriptor) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		m := ymap("key", ystr(d.GetKey()))
		if d.GetValue() != "" {
			m.Content = append(m.Content, ystr("value"), ystr(d.GetValue()))
		}
		if l := d.GetRateLimit(); l != nil {
			m.Content = append(m.Content, ystr("rate_limit"), protoLimit(l))
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			m.Content = append(m.Content, ystr("descriptors"), protoDescriptors(sub))
		}
		if d.GetShadowMode() {
			m.Content = append(m.Content, ystr("shadow_mode"), ybool(true))
		}
		if d.GetDetailedMetric() {
			m.Content = append(m.Content, ystr("detailed_metric"), ybool(true))
		}
		seq.Content = append(seq.Content, m)
	}
	return seq
}

// protoLimit is a rate_limit. An unset unit (UNKNOWN) is left out, as the reference refuses it
// as it refuses a missing one.
func protoLimit(l *rlsconfpb.RateLimitPolicy) *yaml.Node {
	m := ymap("requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10)})
	if u := l.GetUnit(); u != rlsconfpb.RateLimitUnit_UNKNOWN {
		m.Content = append(m.Content, ystr("unit"), ystr(u.String()))
	}
	if l.GetUnlimited() {
		m.Content = append(m.Content, ystr("unlimited"), ybool(true))
	}
	if l.GetName() != "" {
		m.Content = append(m.Content, ystr("name"), ystr(l.GetName()))
	}
	if rs := l.GetReplaces(); len(rs) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			seq.Content = append(seq.Content, ymap("name", ystr(r.GetName())))
		}
		m.Content = append(m.Content, ystr("replaces"), seq)
	}
	return m
}

func ymap(k string, v *yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{ystr(k), v}}
}

func ystr(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
}

func ybool(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}
