//go:build keyhash_linkname

// The hash this package used before hash/maphash's String and Bytes: the runtime's memory hash,
// reached through go:linkname. It is kept only as the baseline of BenchmarkHash, behind a build
// tag, so that the package's build and tests do not depend on the runtime keeping it reachable:
//
//	go test -tags keyhash_linkname -run '^$' -bench Hash -count 6 ./internal/keyhash

package keyhash

import (
	"testing"
	"unsafe"
)

//go:linkname memhash runtime.memhash
//go:noescape
func memhash(p unsafe.Pointer, h, n uintptr) uintptr

// linknameString is the old Hasher.String, under the key k.
func linknameString(s string, k uint64) uint64 {
	return uint64(memhash(unsafe.Pointer(unsafe.StringData(s)), uintptr(k), uintptr(len(s))))
}

// linknameStrings is the old Hasher.Strings.
func linknameStrings(a, b string, k uint64) uint64 {
	return linknameString(b, linknameString(a, k)^uint64(len(a)))
}

func init() {
	baselines = append(baselines,
		baseline{"linkname/String", func(k uint64, s string) uint64 { return linknameString(s, k) }},
		baseline{"linkname/Strings", func(k uint64, s string) uint64 { return linknameStrings("budget", s, k) }},
	)
}

// The baseline hashes as the runtime's maps do: a string's hash depends on its content only.
func TestLinknameBaseline(t *testing.T) {
	a, b := "customer-42", string([]byte("customer-42"))
	if linknameString(a, 7) != linknameString(b, 7) || linknameString(a, 7) == linknameString(a, 9) {
		t.Error("the linkname baseline does not hash by content under its key")
	}
}
