package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// version, commit and date say which sluice this is. A release build sets them:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD) -X main.date=$(date -u +%FT%TZ)" ./cmd/sluice
//
// Each one left empty falls back to what Go recorded in the binary (see package
// internal/buildinfo, which every place that says the version reads: --version and the
// sluice_build_info metric alike). This Go does not stamp the commit in a `git worktree`
// checkout, whose .git is a file.
var version, commit, date = "", "", ""

func init() { buildinfo.Stamp(version, commit, date) }

// fromBuildInfo is what this command says of its build, given Go's build information bi (ok
// false: none).
func fromBuildInfo(bi *debug.BuildInfo, ok bool) buildinfo.Info {
	return buildinfo.From(buildinfo.Info{Version: version, Commit: commit, Date: date}, bi, ok)
}

// versionString is the line `sluice version` and `sluice --version` print, without "sluice ":
// buildinfo.Read's, from this command's values as they are now (a test may change them).
func versionString() string { return fromBuildInfo(debug.ReadBuildInfo()).String() }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sluice's version, the commit it was built from and the commit's date (also: sluice --version)",
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
