package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version, commit and date say which sluice this is. A release build sets them:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD) -X main.date=$(date -u +%FT%TZ)" ./cmd/sluice
//
// Each one left empty falls back to what Go recorded in the binary: the module version (set by
// `go install github.com/sluicehq/sluice/cmd/sluice@v1.2.3`, else "devel"), and the commit and
// its time that `go build` stamps in a git checkout (-buildvcs=auto, its default; this Go does
// not stamp in a `git worktree` checkout, whose .git is a file).
var version, commit, date = "", "", ""

// buildInfo is what the binary says of its build: version, commit, commit time, and whether the
// work tree had changes not committed (only known from the build info; a set commit is taken as
// built clean).
type buildInfo struct {
	version, commit, date string
	modified              bool
}

func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok)
}

// fromBuildInfo is readBuildInfo of the build info bi (ok false: none).
func fromBuildInfo(bi *debug.BuildInfo, ok bool) buildInfo {
	b := buildInfo{version: version, commit: commit, date: date}
	if !ok {
		if b.version == "" {
			b.version = "devel"
		}
		return b
	}
	if b.version == "" {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			b.version = v
		} else {
			b.version = "devel"
		}
	}
	var rev, at string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if b.commit == "" {
		// The stamped commit's own time and state: not mixed with a commit set by -X.
		b.commit, b.modified = rev, dirty
		if b.date == "" {
			b.date = at
		}
	}
	return b
}

// versionString is the line `sluice version` and `sluice --version` print, without "sluice ":
// "v1.2.3 (commit 0123abcd…, 2026-12-01T12:21:00Z)"; "+modified" after the commit when the
// work tree had changes; just the version when the build recorded no commit.
func versionString() string { return readBuildInfo().String() }

func (b buildInfo) String() string {
	var extra []string
	if b.commit != "" {
		c := "commit " + b.commit
		if b.modified {
			c += "+modified"
		}
		extra = append(extra, c)
	}
	if b.date != "" {
		extra = append(extra, b.date)
	}
	if len(extra) == 0 {
		return b.version
	}
	return b.version + " (" + strings.Join(extra, ", ") + ")"
}

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
