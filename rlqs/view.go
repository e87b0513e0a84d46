package rlqs

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Bounds of View: the buckets whose ledgers it reads (the busiest first), how long it waits for
// them in all, and how many it reads at once.
const (
	ViewBuckets = 100
	ViewTimeout = time.Second
	viewReaders = 8
)

// RuleStats is one rule of rls.quota as it runs.
type RuleStats struct {
	Name    string  `json:"name"`
	Match   string  `json:"match"` // {name: chat, user: *}
	Blanket string  `json:"blanket,omitempty"`
	Limit   int64   `json:"limit,omitempty"` // per bucket, per period, across its Envoys
	PeriodS float64 `json:"period_s,omitempty"`
	Burst   int64   `json:"burst,omitempty"`
}

// LedgerError is the service's last ledger error: a refresh the ledger did not answer (the Envoy
// keeps its assignment until it expires, then follows its expired_assignment_behavior).
type LedgerError struct {
	At    time.Time `json:"at"`
	Rule  string    `json:"rule"`
	Error string    `json:"error"`
}

// BucketLedger is one bucket's ledger as View read it: every Envoy stream that reports the bucket,
// on every instance that shares the ledger (the Redis store's), or Error.
type BucketLedger struct {
	Rule   string            `json:"rule"`
	ID     map[string]string `json:"id"` // as BucketStats.ID
	Ledger string            `json:"ledger"`
	Limit  int64             `json:"limit"`
	Error  string            `json:"error,omitempty"` // the ledger could not be read
	// The ledger's clock at the read; when its state began; whether it hands out no new quota
	// yet (a new state: a lease and the hold).
	Now      time.Time `json:"now,omitzero"`
	Since    time.Time `json:"since,omitzero"`
	Learning bool      `json:"learning,omitempty"`
	// Want is the live Envoys' demand together (units per period), Outstanding their
	// allotments' sum (never above the limit), Held what the ledger counts as held.
	Want        int64          `json:"want"`
	Outstanding int64          `json:"outstanding"`
	Held        int64          `json:"held"`
	Envoys      []LedgerRecord `json:"envoys"`
}

// LedgerRecord is one Envoy stream's record in a bucket's ledger.
type LedgerRecord struct {
	Client    string    `json:"client"`
	Here      bool      `json:"here"` // a stream of this instance
	Want      int64     `json:"want"`
	Allotment int64     `json:"allotment"`
	Live      bool      `json:"live"` // its lease (the assignment's time to live) has not ended
	Expires   time.Time `json:"expires"`
	Holding   int64     `json:"holding"`
	Allowed   int64     `json:"allowed"` // in its last report
	Denied    int64     `json:"denied"`
	At        time.Time `json:"at"` // its last refresh
}

// View is Stats with each bucket's ledger read (Stats.Ledgers): for the ViewBuckets busiest
// buckets of a limit rule this instance serves (by their demand here, then their requests in the
// last reports), the ledger's record of every Envoy that reports it, on every instance sharing it.
// The reads take at most ViewTimeout (and ctx); a ledger that does not answer in time has its
// error.
func (s *Service) View(ctx context.Context) Stats {
	st := s.Stats()
	type pick struct {
		i     int
		heat  int64
		reqs  uint64
		ledge string
	}
	var picks []pick
	for i, b := range st.Buckets {
		if b.Ledger == "" {
			continue
		}
		p := pick{i: i, heat: b.Want, ledge: b.Ledger}
		for _, e := range b.Envoys {
			p.reqs += e.Allowed + e.Denied
		}
		picks = append(picks, p)
	}
	sort.Slice(picks, func(a, b int) bool {
		x, y := picks[a], picks[b]
		if x.heat != y.heat {
			return x.heat > y.heat
		}
		if x.reqs != y.reqs {
			return x.reqs > y.reqs
		}
		return x.ledge < y.ledge
	})
	if len(picks) > ViewBuckets {
		st.LedgersOmitted = len(picks) - ViewBuckets
		picks = picks[:ViewBuckets]
	}
	here := map[string]bool{}
	for _, c := range st.Clients {
		here[c.ID] = true
	}
	ctx, cancel := context.WithTimeout(ctx, ViewTimeout)
	defer cancel()
	st.Ledgers = make([]BucketLedger, len(picks))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(viewReaders, len(picks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				st.Ledgers[j] = s.readLedger(ctx, st.Buckets[picks[j].i], here)
			}
		}()
	}
	for j := range picks {
		work <- j
	}
	close(work)
	wg.Wait()
	return st
}

// readLedger reads bucket b's ledger, the one this instance refreshes it on.
func (s *Service) readLedger(ctx context.Context, b BucketStats, here map[string]bool) BucketLedger {
	out := BucketLedger{Rule: b.Rule, ID: b.ID, Ledger: b.Ledger, Limit: b.Limit, Envoys: []LedgerRecord{}}
	if err := ctx.Err(); err != nil {
		out.Error = "not read: " + err.Error()
		return out
	}
	s.mu.Lock()
	bk := s.books[b.Ledger]
	s.mu.Unlock()
	if bk == nil {
		out.Error = "no ledger yet: the bucket has not been refreshed on it"
		return out
	}
	v, err := bk.l.Read(ctx)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Now, out.Since, out.Learning = v.Now, v.Since, v.Learning
	out.Outstanding, out.Held = v.Outstanding(), v.Held()
	for _, r := range v.Regions {
		if r.Live {
			out.Want += r.Want
		}
		out.Envoys = append(out.Envoys, LedgerRecord{Client: r.Region, Here: here[r.Region], Want: r.Want, Allotment: r.Allotment,
			Live: r.Live, Expires: r.Expires, Holding: r.Holding, Allowed: r.Admitted, Denied: r.Refused, At: r.At})
	}
	return out
}
