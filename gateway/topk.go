package gateway

import (
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/keyhash"
)

// topK finds the heaviest keys of a stream fed by clients (addresses, API-key hashes) in bounded
// memory: the Space-Saving algorithm (Metwally, Agrawal, El Abbadi 2005) with k counters (per
// shard, below), kept
// per window of time and reported over the current window and the one before it (so a report
// covers between one and two windows).
//
// Its bounds, for N counted in a table: it holds at most k keys whatever the number of distinct
// ones; each key's count over-estimates its true count by at most its Error, which is at most
// N/k; and every key whose true count is over N/k is in the table. Two tables reported
// together keep the bounds with N their sum (a key over (N1+N2)/k is over N1/k or N2/k).
//
// It is sharded by key, so that requests of different keys seldom wait on one lock: each shard
// is a sketch of its own over its keys, with the bounds above for its own N, and every key is in
// one shard only, so a report is the shards' lists together.
type topK struct {
	hash   keyhash.Hasher
	shards [topKShards]topKShard
}

const topKShards = 8

type topKShard struct {
	mu     sync.Mutex
	k      int
	window time.Duration
	w      int64   // the current window's number (unix time / window)
	cur    ssTable // guarded by mu
	prev   ssTable // the window before cur; empty if no request came in it
}

// ssTable is one window's Space-Saving table.
type ssTable struct {
	idx   map[string]int // key -> its item
	items []ssItem       // at most k
	total uint64         // N: everything counted in the window
}

// ssItem is one monitored key.
type ssItem struct {
	key   string
	count uint64   // over-estimates the key's count by at most err
	err   uint64   // the count of the key it took the place of
	seen  uint64   // counted since it took its place: what sums average over
	sums  [2]int64 // per-use sums of what the caller adds (e.g. µs), over seen
}

// newTopK returns a sketch of k counters per shard and window.
func newTopK(k int, window time.Duration) *topK {
	t := &topK{hash: keyhash.New()}
	for i := range t.shards {
		t.shards[i].k, t.shards[i].window = k, window
	}
	return t
}

// add counts key once at now, with aux added to its sums.
func (t *topK) add(key string, now time.Time, aux [2]int64) {
	sh := &t.shards[t.hash.String(key)%topKShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.rotate(now)
	sh.cur.add(sh.k, key, aux)
}

// rotate starts a new window if now is past the current one.
func (t *topKShard) rotate(now time.Time) {
	w := now.UnixNano() / int64(t.window)
	if w == t.w {
		return
	}
	if w == t.w+1 {
		t.prev = t.cur
	} else {
		t.prev = ssTable{}
	}
	t.cur, t.w = ssTable{}, w
}

func (s *ssTable) add(k int, key string, aux [2]int64) {
	s.total++
	if i, ok := s.idx[key]; ok {
		it := &s.items[i]
		it.count++
		it.seen++
		it.sums[0] += aux[0]
		it.sums[1] += aux[1]
		return
	}
	if s.idx == nil {
		s.idx = make(map[string]int, k)
	}
	key = strings.Clone(key) // the engines may reuse a request's memory
	if len(s.items) < k {
		s.idx[key] = len(s.items)
		s.items = append(s.items, ssItem{key: key, count: 1, seen: 1, sums: aux})
		return
	}
	m := 0 // the least counted item gives its place up (and its count, as the new key's error)
	for i := range s.items {
		if s.items[i].count < s.items[m].count {
			m = i
		}
	}
	it := &s.items[m]
	delete(s.idx, it.key)
	*it = ssItem{key: key, count: it.count + 1, err: it.count, seen: 1, sums: aux}
	s.idx[key] = m
}

// min is the least count of a full table: what a key absent from it may have had (0 if the
// table is not full: then every key counted is in it).
func (s *ssTable) min(k int) uint64 {
	if len(s.items) < k {
		return 0
	}
	m := s.items[0].count
	for _, it := range s.items {
		m = min(m, it.count)
	}
	return m
}

// Hitter is one heavy key over the last one to two windows.
type Hitter struct {
	Key string `json:"key"`
	// Count is its estimated count: at most Error more than the true one (never less).
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
	seen  uint64
	sums  [2]int64
}

// top returns the n heaviest keys at now, heaviest first (then by key), and N, the total
// counted over the windows reported.
func (t *topK) top(now time.Time, n int) ([]Hitter, uint64) {
	out := []Hitter{} // [] in JSON, not null
	var total uint64
	for i := range t.shards {
		o, n := t.shards[i].top(now)
		out = append(out, o...)
		total += n
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, total
}

// top returns the shard's keys at now, and its N.
func (t *topKShard) top(now time.Time) ([]Hitter, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	byKey := map[string]*Hitter{}
	tables := [2]*ssTable{&t.prev, &t.cur}
	for _, s := range tables {
		for _, it := range s.items {
			h := byKey[it.key]
			if h == nil {
				h = &Hitter{Key: it.key}
				byKey[it.key] = h
			}
			h.Count += it.count
			h.Error += it.err
			h.seen += it.seen
			h.sums[0] += it.sums[0]
			h.sums[1] += it.sums[1]
		}
	}
	for _, s := range tables {
		if m := s.min(t.k); m > 0 {
			for key, h := range byKey {
				if _, ok := s.idx[key]; !ok { // it may have had up to m there
					h.Count += m
					h.Error += m
				}
			}
		}
	}
	out := make([]Hitter, 0, len(byKey))
	for _, h := range byKey {
		out = append(out, *h)
	}
	return out, t.prev.total + t.cur.total
}

// size is the number of entries held (items and index, both tables, every shard), for the tests
// of the bound: at most 4 k per shard.
func (t *topK) size() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.cur.items) + len(sh.prev.items) + len(sh.cur.idx) + len(sh.prev.idx)
		sh.mu.Unlock()
	}
	return n
}
