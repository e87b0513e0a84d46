package main

// Side by side with the peer: envoyproxy/ratelimit (built from its Go module at
// peertest.Version) and sluice serve, on one real redis-server and the same configuration files,
// are sent the same request sequences (those of the peer's own integration tests and more); both
// must give the answers the peer is recorded giving, sluice with the documented exceptions only.

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// peerExceptions are the sequences sluice answers differently from the peer, on purpose
// (peertest.Differences). A listed sequence that stops differing fails the test too, so that the
// list stays true.
var peerExceptions = peertest.Differences

func TestRLSMatchesPeer(t *testing.T) {
	rs := redistest.Start(t)
	seqs := peertest.Sequences()
	files := peertest.ConfigFiles(t, seqs...)
	peer := peertest.NewClient(t, peertest.Start(t, rs.Addr, files...))
	dir := t.TempDir()
	var addr string
	startSluice(t, dir, "sluice.yaml", func(listen, admin string) string {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addr = a
		// No cache of refusals: the test flushes Redis between sequences, which a cached refusal
		// would outlive (up to its Retry-After).
		return fmt.Sprintf("listen: \"\"\nadmin_listen: %s\nrls: {listen: %s, envoy_config: [%s]}\nstore: {type: redis, addrs: [%s], refusal_cache: 0}\n",
			admin, a, strings.Join(files, ", "), rs.Addr)
	})
	sluice := peertest.NewClient(t, addr)
	sluice.Extras = true // its RateLimit fields and problem bodies: checked in TestServeE2ERLS and package rls
	flush := func() error {
		if r, err := rs.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	var differing []string
	for _, s := range seqs {
		t.Run(s.Name, func(t *testing.T) {
			peertest.Check(t, s, peer, flush) // the recorded answers are the peer's, today
			res := s.Run(t.Context(), sluice, flush)
			why, excepted := peerExceptions[s.Name]
			switch {
			case len(res.Diffs) > 0 && excepted:
				differing = append(differing, s.Name)
				t.Logf("differs, as documented (%s):", why)
				for _, d := range res.Diffs {
					t.Logf("  %v", d)
				}
			case len(res.Diffs) > 0:
				for _, d := range res.Diffs {
					t.Errorf("sluice: %v", d)
				}
			case excepted:
				t.Errorf("sluice answers as the peer does, but peerExceptions says it differs (%s): update the list and docs/envoy.md", why)
			}
		})
	}
	for name := range peerExceptions {
		if !slices.ContainsFunc(seqs, func(s peertest.Sequence) bool { return s.Name == name }) {
			t.Errorf("peerExceptions names %q, which is no sequence", name)
		}
	}
	t.Logf("%d sequences, %d differing as documented: %v", len(seqs), len(differing), differing)
}
