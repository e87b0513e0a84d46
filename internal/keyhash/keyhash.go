// Package keyhash hashes client keys to shards with a key random per process, so that clients
// cannot aim their keys at one shard (and one lock, one map) of the memory store, the local
// budgets, the refusal cache or the early-retry table.
//
// It hashes with hash/maphash's String, Bytes and Comparable, under a maphash.Seed that New
// makes. They hash a string, a slice or a pair of strings in place with the function behind Go's
// maps (AES instructions where the processor has them). A maphash.Hash would first copy every key
// into its 128-byte buffer, which took three to four times as long, and the hash is on the path
// of every memory-store decision. The package needs no unsafe code and no access to the runtime's
// internals; BenchmarkHash, with the build tag keyhash_linkname, measures it beside the runtime
// function it used to call directly.
package keyhash

import "hash/maphash"

// Hasher hashes strings under one random key. Make it with New: the zero Hasher has no key, and
// its methods panic (as maphash's do with a zero Seed). Safe for concurrent use, and copies hash
// alike.
type Hasher struct{ k maphash.Seed }

// New returns a Hasher with a key drawn now.
func New() Hasher { return Hasher{k: maphash.MakeSeed()} }

// String returns the hash of s.
func (k *Hasher) String(s string) uint64 { return maphash.String(k.k, s) }

// Strings returns the hash of a and b together, as the hash of a struct holding the two (the hash
// Go's maps give such a key: each string's content and length in turn), so that ("ab", "c") and
// ("a", "bc") differ.
func (k *Hasher) Strings(a, b string) uint64 {
	if k.k == (maphash.Seed{}) { // Comparable would hash under the zero Seed rather than panic
		panic("keyhash: use of the zero Hasher; make one with New")
	}
	return maphash.Comparable(k.k, pair{a, b})
}

// pair is what Strings hashes.
type pair struct{ a, b string }

// Bytes returns the hash of b (a network address's 16 bytes, say).
func (k *Hasher) Bytes(b []byte) uint64 { return maphash.Bytes(k.k, b) }
