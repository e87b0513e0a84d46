// Package keyhash hashes client keys to shards with a key random per process, so that clients
// cannot aim their keys at one shard (and one lock, one map) of the memory store, the local
// budgets, the refusal cache or the early-retry table.
package keyhash

import "hash/maphash"

// Hasher hashes strings under one random key. Make it with New; the zero Hasher is not ready
// (each copy of a zero maphash.Hash would draw a key of its own). Safe for concurrent use: each
// call works on a copy.
type Hasher struct{ h maphash.Hash }

// New returns a Hasher with a key drawn now.
func New() Hasher {
	var k Hasher
	k.h.Reset() // draws the random key, which copies keep
	return k
}

// String returns the hash of s.
func (k *Hasher) String(s string) uint64 {
	h := k.h // a copy: the key, none of the state
	h.WriteString(s)
	return h.Sum64()
}

// Strings returns the hash of a and b together, a 0 byte between them (so that ("ab", "c") and
// ("a", "bc") differ).
func (k *Hasher) Strings(a, b string) uint64 {
	h := k.h
	h.WriteString(a)
	h.WriteByte(0)
	h.WriteString(b)
	return h.Sum64()
}

// Bytes returns the hash of b (a network address's 16 bytes, say).
func (k *Hasher) Bytes(b []byte) uint64 {
	h := k.h
	h.Write(b)
	return h.Sum64()
}
