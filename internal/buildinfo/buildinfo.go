// Package buildinfo says which sluice this is, for every place that says it (`sluice --version`,
// `sluice version`, the sluice_build_info metric): one reading of the binary, so that they
// cannot disagree.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Info is what the binary says of its build: version, commit, commit time, and whether the work
// tree had changes not committed (only known from Go's build information; a commit set by
// Stamp is taken as built clean).
type Info struct {
	Version, Commit, Date string
	Modified              bool
}

// stamped is what Stamp was given: a release build's -ldflags -X values.
var stamped Info

// Stamp sets the values a release build gave the command (`go build -ldflags "-X
// main.version=… -X main.commit=… -X main.date=…"`); each one left empty falls back to Go's
// build information. The command calls it once, at its start, before anything reads them.
func Stamp(version, commit, date string) {
	stamped = Info{Version: version, Commit: commit, Date: date}
}

// Read is this binary's Info: what Stamp set, else what Go recorded in the binary: the module
// version (set by `go install github.com/sluicehq/sluice/cmd/sluice@v1.2.3`, else "devel"), and
// the commit and its time that `go build` stamps in a git checkout (-buildvcs=auto).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	return From(stamped, bi, ok)
}

// From is Read of the stamped values s and the build information bi (ok false: none).
func From(s Info, bi *debug.BuildInfo, ok bool) Info {
	b := Info{Version: s.Version, Commit: s.Commit, Date: s.Date}
	if b.Version == "" {
		b.Version = "devel"
		if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
	}
	if !ok || b.Commit != "" {
		return b
	}
	// The recorded commit's own time and state: not mixed with a commit set by Stamp.
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			if b.Date == "" {
				b.Date = s.Value
			}
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// CommitLabel is the commit as one value: "+modified" after it when the work tree had changes.
// "" when the build recorded none.
func (b Info) CommitLabel() string {
	if b.Commit != "" && b.Modified {
		return b.Commit + "+modified"
	}
	return b.Commit
}

// String is the line `sluice version` and `sluice --version` print, without "sluice ":
// "v1.2.3 (commit 0123abcd…, 2026-12-01T12:21:00Z)"; "+modified" after the commit when the work
// tree had changes; just the version when the build recorded no commit.
func (b Info) String() string {
	var extra []string
	if c := b.CommitLabel(); c != "" {
		extra = append(extra, "commit "+c)
	}
	if b.Date != "" {
		extra = append(extra, b.Date)
	}
	if len(extra) == 0 {
		return b.Version
	}
	return b.Version + " (" + strings.Join(extra, ", ") + ")"
}
