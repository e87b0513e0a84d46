package keyhash

import "testing"

// A Hasher's copies hash alike (they share its key), two Hashers do not (each draws its own), and
// Strings keeps the boundary between its two parts.
func TestHasher(t *testing.T) {
	a, b := New(), New()
	c := a
	if a.String("customer-42") != c.String("customer-42") || a.String("customer-42") != a.String("customer-42") {
		t.Error("a Hasher and its copy hash one string differently")
	}
	same := 0
	for _, s := range []string{"a", "b", "customer-1", "customer-2", "x"} {
		if a.String(s) == b.String(s) {
			same++
		}
	}
	if same == 5 {
		t.Error("two Hashers hash alike: the key is not random")
	}
	if a.Bytes([]byte("customer-42")) != c.Bytes([]byte("customer-42")) || a.Bytes([]byte{192, 0, 2, 1}) == a.Bytes([]byte{192, 0, 2, 2}) {
		t.Error("Bytes: a copy hashes differently, or two addresses alike")
	}
	if a.Strings("ab", "c") == a.Strings("a", "bc") {
		t.Error(`Strings("ab", "c") == Strings("a", "bc")`)
	}
}

// The zero Hasher has no key: rather than hash under one every process shares, it panics.
func TestZeroHasherPanics(t *testing.T) {
	for name, f := range map[string]func(h *Hasher){
		"String":  func(h *Hasher) { h.String("customer-42") },
		"Strings": func(h *Hasher) { h.Strings("budget", "customer-42") },
		"Bytes":   func(h *Hasher) { h.Bytes([]byte{192, 0, 2, 1}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("the zero Hasher's %s did not panic", name)
				}
			}()
			var h Hasher
			f(&h)
		}()
	}
}
