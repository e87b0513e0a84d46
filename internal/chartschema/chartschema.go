// Package chartschema makes the Helm chart's values.schema.json: the chart's own values, from
// deploy/helm/values.schema.yaml, with `config` checked by sluice's configuration schema
// (config.JSONSchema's), so that a misspelt field of the configuration fails `helm install`
// and `helm template` instead of the pods.
package chartschema

import (
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/config"
)

// Generate returns values.schema.json for the chart-values part (YAML, JSON Schema draft-07).
func Generate(part []byte) ([]byte, error) {
	var s map[string]any
	if err := yaml.Unmarshal(part, &s); err != nil {
		return nil, fmt.Errorf("the chart's values schema: %w", err)
	}
	defs, _ := s["definitions"].(map[string]any)
	props, _ := s["properties"].(map[string]any)
	if defs == nil || props == nil {
		return nil, fmt.Errorf("the chart's values schema needs definitions and properties")
	}
	if _, ok := props["config"]; ok {
		return nil, fmt.Errorf("the chart's values schema sets config: it is sluice's configuration schema, added here")
	}
	cfgDefs := map[string]any{}
	cfg := config.RenderSchema(cfgDefs, "#/definitions/")
	for k, v := range cfgDefs {
		if _, ok := defs[k]; ok {
			return nil, fmt.Errorf("definition %q is both the chart's and the configuration's", k)
		}
		defs[k] = v
	}
	cfg["description"] = "sluice's configuration (docs/config.md); the chart writes listen, admin_listen, rls, store.type/addrs/sentinel and admin.tls/token_env over it"
	defs["config"] = cfg
	props["config"] = map[string]any{"$ref": "#/definitions/config"}
	s["$schema"] = "http://json-schema.org/draft-07/schema#"
	s["title"] = "sluice Helm chart values"
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
