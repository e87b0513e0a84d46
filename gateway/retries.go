package gateway

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/keyhash"
)

// earlyRetries remembers, per rate-limit key, until when its last refusal holds, to count the
// common "immediate retry" mistake: a client that comes back before its Retry-After ran out.
// Bounded: a full shard forgets new refusals rather than grow (client input never grows memory).
type earlyRetries struct {
	hasher keyhash.Hasher // picks a key's shard, with a key random per process
	shards [32]struct {
		mu sync.Mutex
		m  map[string]refusal // guarded by mu
	}
	max int // per shard
}

// refusal is a key's last refusal: when, and until when its Retry-After held.
type refusal struct{ at, until time.Time }

func newEarlyRetries(size int) *earlyRetries {
	e := &earlyRetries{max: max(1, size/32), hasher: keyhash.New()}
	for i := range e.shards {
		e.shards[i].m = map[string]refusal{}
	}
	return e
}

// hash is key's hash under the process's random key.
func (e *earlyRetries) hash(key string) uint64 {
	return e.hasher.String(key)
}

// earlyBy reports whether key comes back before its last refusal's Retry-After ran out, and that
// refusal (the diagnosis shows how soon after their refusal the worst offenders retry, and what
// Retry-After they were given).
func (e *earlyRetries) earlyBy(key string, now time.Time) (refusal, bool) {
	sh := &e.shards[e.hash(key)%32]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.m[key]
	if !ok {
		return r, false
	}
	if !now.Before(r.until) {
		delete(sh.m, key)
		return r, false
	}
	return r, true
}

// refusedAt records that key is refused at at until until.
func (e *earlyRetries) refusedAt(key string, at, until time.Time) {
	sh := &e.shards[e.hash(key)%32]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[key]; !ok && len(sh.m) >= e.max {
		n := 0
		for k, u := range sh.m { // drop the expired among a sample
			if !time.Now().Before(u.until) {
				delete(sh.m, k)
			}
			if n++; n == 16 {
				break
			}
		}
		if len(sh.m) >= e.max {
			return
		}
	}
	sh.m[key] = refusal{at, until}
}
