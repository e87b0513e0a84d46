package gateway

import (
	"testing"
	"time"
)

// A key's refusal is found again however many keys share the table: every lookup of a key goes
// to the same shard.
func TestEarlyRetriesFindTheirKey(t *testing.T) {
	e := newEarlyRetries(1 << 10)
	now := time.Now()
	for i := range 200 {
		e.refusedAt(string(rune('a'+i%26))+time.Duration(i).String(), now, now.Add(time.Minute))
	}
	for i := range 200 {
		if _, ok := e.earlyBy(string(rune('a'+i%26))+time.Duration(i).String(), now); !ok {
			t.Fatalf("key %d: its refusal is lost", i)
		}
	}
}
