package gateway

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// Under concurrent first uses, each key's value is made once, and every caller gets that one.
func TestCowMapMakesEachValueOnce(t *testing.T) {
	for round := 0; round < 20; round++ {
		var c cowMap[string, *int]
		var made atomic.Int32
		got := make([][]*int, 8)
		var wg sync.WaitGroup
		for g := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 16; k++ {
					got[g] = append(got[g], c.get(fmt.Sprint(k), func() *int { made.Add(1); return new(int) }))
				}
			}()
		}
		wg.Wait()
		if made.Load() != 16 || len(c.all()) != 16 {
			t.Fatalf("made %d values for 16 keys; map holds %d", made.Load(), len(c.all()))
		}
		for g := range got {
			for k := range got[g] {
				if got[g][k] != got[0][k] {
					t.Fatalf("goroutine %d got another value for key %d", g, k)
				}
			}
		}
	}
}
