package gateway

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// bodyMemory: what fits is granted at once; what does not waits, first come first served (a
// small request does not pass a large one waiting before it), and is refused, holding nothing,
// when its wait runs out; a release or a larger limit lets the waiters in, in order.
func TestBodyMemory(t *testing.T) {
	b := newBodyMemory(prometheus.NewRegistry())
	b.setLimit(100)
	if _, ok := b.acquire(60, time.Hour); !ok {
		t.Fatal("60 of 100: refused")
	}
	if _, ok := b.acquire(50, 10*time.Millisecond); ok {
		t.Fatal("50 more of 100 with 60 held: granted")
	}
	waiters := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.waiters.Len()
	}
	if waiters() != 0 || b.used != 60 {
		t.Fatalf("after a refusal: %d waiting, %d used; want none waiting, 60 used", waiters(), b.used)
	}
	big, small := make(chan bool), make(chan bool)
	go func() { _, ok := b.acquire(80, time.Hour); big <- ok }()
	for waiters() != 1 {
		time.Sleep(time.Millisecond) // (until the goroutine has queued)
	}
	go func() { _, ok := b.acquire(10, time.Hour); small <- ok }()
	for waiters() != 2 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-small:
		t.Fatal("10 bytes passed 80 waiting before them")
	default:
	}
	b.release(60)
	if !<-big || !<-small {
		t.Fatal("a waiter refused")
	}
	if b.used != 90 {
		t.Fatalf("%d used, want 90", b.used)
	}
	b.release(80) // (10 still held)
	b.setLimit(50)
	done := make(chan bool)
	go func() { _, ok := b.acquire(50, time.Hour); done <- ok }()
	for waiters() != 1 {
		time.Sleep(time.Millisecond)
	}
	b.setLimit(60) // a reload that raises the budget lets it in
	if !<-done || b.used != 60 {
		t.Fatalf("after the limit was raised: used %d, want 60", b.used)
	}
	b.release(60)
	b.setLimit(50)
	if n, ok := b.acquire(500, time.Hour); !ok || n != 50 || b.used != 50 {
		t.Fatalf("500 bytes of a budget of 50: reserved %d (%v), %d used; want the whole budget, 50", n, ok, b.used)
	}
	var h heldBody
	h.hold(b, 50)
	h.shrink(20) // (a chunked body smaller than it reserved)
	if b.used != 20 {
		t.Fatalf("after a held body shrank to 20: %d used, want 20", b.used)
	}
	h.shrink(30) // (never grows)
	h.release()
	h.release() // (once only)
	if b.used != 0 {
		t.Fatalf("after a held body was given back twice: %d used, want 0", b.used)
	}
}
