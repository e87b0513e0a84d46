// Command gen writes the Helm chart's values.schema.json from deploy/helm/values.schema.yaml (the
// chart's own values) and sluice's configuration schema (config.JSONSchema). Run it from the
// repository's root after changing either: go generate ./deploy/helm/gen
package main

//go:generate go run . -in ../values.schema.yaml -out ../sluice/values.schema.json

import (
	"flag"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/chartschema"
)

func main() {
	in := flag.String("in", "deploy/helm/values.schema.yaml", "the chart's own values schema (YAML)")
	out := flag.String("out", "deploy/helm/sluice/values.schema.json", "the file to write")
	flag.Parse()
	part, err := os.ReadFile(*in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	s, err := chartschema.Generate(part)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, s, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
