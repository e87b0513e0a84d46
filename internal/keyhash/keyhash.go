// Package keyhash hashes client keys to shards with a key random per process, so that clients
// cannot aim their keys at one shard (and one lock, one map) of the memory store, the local
// budgets, the refusal cache or the early-retry table.
package keyhash

import "hash/maphash"

// Hasher hashes strings under one random key. Make it with New; the zero Hasher is not ready
// (maphash refuses its zero seed). Safe for concurrent use.
//
// It keeps a maphash.Seed, not a maphash.Hash: maphash.String hashes a string in place, where a
// copy of a Hash (a 128-byte buffer) written to and summed copies the string into its buffer
// first — a cost on every decision of the memory store.
type Hasher struct{ seed maphash.Seed }

// New returns a Hasher with a key drawn now.
func New() Hasher { return Hasher{seed: maphash.MakeSeed()} }

// String returns the hash of s.
func (k *Hasher) String(s string) uint64 { return maphash.String(k.seed, s) }

// Strings returns the hash of a and b together, a 0 byte between them (so that ("ab", "c") and
// ("a", "bc") differ).
func (k *Hasher) Strings(a, b string) uint64 {
	var h maphash.Hash
	h.SetSeed(k.seed)
	h.WriteString(a)
	h.WriteByte(0)
	h.WriteString(b)
	return h.Sum64()
}

// Bytes returns the hash of b (a network address's 16 bytes, say).
func (k *Hasher) Bytes(b []byte) uint64 { return maphash.Bytes(k.seed, b) }
