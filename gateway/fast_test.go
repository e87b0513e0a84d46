package gateway

import (
	"bufio"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// removeHopHeaders drops the hop-by-hop fields and those Connection names, and keeps the lines
// of every other field in their order, wherever the dropped ones were among them (fasthttp's own
// Del swaps the last line into the gap).
func TestRemoveHopHeadersKeepsOrder(t *testing.T) {
	lines := []string{"Keep-Alive: timeout=5", "Te: trailers", "Expect: 100-continue", "Connection: X-Foo", "X-Foo: 1",
		"X-Forwarded-For: a", "X-Forwarded-For: b", "X-Forwarded-For: c", "Via: 1", "Via: 2", "Accept: x"}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		rng.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
		raw := "GET / HTTP/1.1\r\nHost: h\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n"
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatal(err)
		}
		removeHopHeaders(&h, "Expect")
		var got []string
		for k, v := range h.All() {
			got = append(got, string(k)+": "+string(v))
		}
		for _, name := range []string{"X-Forwarded-For", "Via"} {
			if f, want := filter(got, name), filter(lines, name); !slices.Equal(f, want) {
				t.Fatalf("order %q: %s became %q", lines, name, f)
			}
		}
		for _, gone := range []string{"Keep-Alive", "Te", "Expect", "X-Foo", "Connection"} {
			if f := filter(got, gone); len(f) > 0 {
				t.Fatalf("order %q: %s kept: %q", lines, gone, got)
			}
		}
		if len(filter(got, "Accept")) != 1 || len(filter(got, "Host")) != 1 {
			t.Fatalf("order %q: lost a field: %q", lines, got)
		}
	}
}

func filter(lines []string, name string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, name+": ") {
			out = append(out, l)
		}
	}
	return out
}
