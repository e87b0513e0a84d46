package keyhash

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// baseline is a hash BenchmarkHash measures beside this package's: k is a key drawn per run.
type baseline struct {
	name string
	hash func(k uint64, s string) uint64
}

// baselines are filled by files built with the tag keyhash_linkname (linkname_test.go): the
// runtime's memory hash that the package called before.
var baselines []baseline

// benchKeys are a short key, a typical one and a 40-byte one (an API key or a JWT subject, say).
var benchKeys = []string{"customer-42", "tenant-7/customer-1234567", "sk-live-4f9c2a7be81d03c6f5a9e2b7d41c8f0a"}

// BenchmarkHash measures Hasher.String and Hasher.Strings (as budgets call it, a short name then
// the key) on keys of each length, interleaved with the baselines when they are built in, so that
// one run compares them under the same load. A sink keeps the compiler from dropping the calls.
func BenchmarkHash(b *testing.B) {
	h := New()
	k := rand.Uint64() | 1
	var sink uint64
	for _, key := range benchKeys {
		b.Run(fmt.Sprintf("len=%d/maphash/String", len(key)), func(b *testing.B) {
			for b.Loop() {
				sink += h.String(key)
			}
		})
		b.Run(fmt.Sprintf("len=%d/maphash/Strings", len(key)), func(b *testing.B) {
			for b.Loop() {
				sink += h.Strings("budget", key)
			}
		})
		for _, base := range baselines {
			b.Run(fmt.Sprintf("len=%d/%s", len(key), base.name), func(b *testing.B) {
				for b.Loop() {
					sink += base.hash(k, key)
				}
			})
		}
	}
	if sink == 42 {
		b.Log("unlikely")
	}
}
