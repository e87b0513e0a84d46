package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is sluice's version, set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/sluice
//
// When empty, versionString falls back to the module version Go recorded in the binary (set by
// `go install github.com/sluicehq/sluice/cmd/sluice@v1.2.3`), or "devel".
var version = ""

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sluice's version",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("version takes no arguments, got %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := fmt.Fprintf(cmd.OutOrStdout(), "sluice %s\n", versionString()); err != nil {
				return failure{err}
			}
			return nil
		},
	}
}
