// Package keyhash hashes client keys to shards with a key random per process, so that clients
// cannot aim their keys at one shard (and one lock, one map) of the memory store, the local
// budgets, the refusal cache or the early-retry table.
//
// It calls the runtime's own memory hash, the function behind Go's maps and hash/maphash (AES
// instructions where the processor has them, with keys the runtime draws at start), on the
// string in place. Going through a maphash.Hash instead meant copying its 128-byte buffer and
// the key into it for every key: 12 ns a key on our machines, against 4 ns in place, on the
// path of every memory-store decision. The runtime keeps this function reachable for exactly
// such callers (its source lists them, go.dev/issue/67401), and hash/maphash reaches it the
// same way.
package keyhash

import (
	"math/rand/v2"
	"unsafe"
)

//go:linkname memhash runtime.memhash
//go:noescape
func memhash(p unsafe.Pointer, h, n uintptr) uintptr

// Hasher hashes strings under one random key. Make it with New; the zero Hasher hashes under
// the key 0, which is no secret. Safe for concurrent use, and copies hash alike.
type Hasher struct{ k uint64 }

// New returns a Hasher with a key drawn now.
func New() Hasher { return Hasher{k: rand.Uint64() | 1} }

// String returns the hash of s.
func (k *Hasher) String(s string) uint64 { return hash(s, k.k) }

// hash is the hash of s starting from h.
func hash(s string, h uint64) uint64 {
	return uint64(memhash(unsafe.Pointer(unsafe.StringData(s)), uintptr(h), uintptr(len(s))))
}

// Strings returns the hash of a and b together, their lengths mixed in between (so that ("ab",
// "c") and ("a", "bc") differ).
func (k *Hasher) Strings(a, b string) uint64 {
	return hash(b, hash(a, k.k)^uint64(len(a)))
}

// Bytes returns the hash of b (a network address's 16 bytes, say).
func (k *Hasher) Bytes(b []byte) uint64 {
	return uint64(memhash(unsafe.Pointer(unsafe.SliceData(b)), uintptr(k.k), uintptr(len(b))))
}
