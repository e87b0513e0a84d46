package rlqs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/ledger"
)

// Bounds on what an Envoy may report: a bucket id's entries and their sizes, and the buckets one
// stream may hold (a client's input never grows memory without bound).
const (
	MaxIDEntries     = config.MaxQuotaMatch
	MaxIDBytes       = config.MaxQuotaValue
	MaxStreamBuckets = 10000
	maxReportBuckets = 4 * MaxStreamBuckets // (the gRPC server's message bound, MaxMessage, comes first)
	// MaxMessage bounds a message on the rate limit service's gRPC server when the quota service
	// runs there: an Envoy reports all its buckets in one message (some 40 bytes each), where a
	// per-request call is a few descriptors (64 KiB).
	MaxMessage        = 1 << 20
	deliveryMargin    = time.Second // at most: an assignment's way to its Envoy (the ledger's hold)
	wildcard          = "*"
	bucketHashLen     = 16 // hex digits of a bucket's name in the ledger's keys
	assignmentGrowMin = 50 // a grown allotment is sent when it grows by more than 1/50 (2%), or shrinks
)

// Rules are rls.quota compiled: its timing and its rules, matched in order of specificity.
type Rules struct {
	quota config.Quota
	rules []*Rule
	algo  allot.Algorithm
}

// Rule is one bucket rule of rls.quota.
type Rule struct {
	config.QuotaBucket
	exact int // the exact values it matches
}

// Blanket reports whether the rule answers ALLOW_ALL or DENY_ALL rather than a limit.
func (r *Rule) blanket() bool { return r.Blanket != "" }

// Compile compiles rls.quota (checked by package config).
func Compile(q *config.Quota) *Rules {
	rs := &Rules{quota: *q, algo: allot.Fair}
	if q.Algorithm == "proportional" {
		rs.algo = allot.Proportional
	}
	for _, b := range q.Buckets {
		r := &Rule{QuotaBucket: b}
		for _, v := range b.Match {
			if v != wildcard {
				r.exact++
			}
		}
		rs.rules = append(rs.rules, r)
	}
	return rs
}

// Quota is the configuration the rules were compiled from.
func (rs *Rules) Quota() config.Quota { return rs.quota }

// Match returns the rule for a bucket id: of the rules with exactly its keys whose exact values
// it has, the one with the most exact values, then the first. nil: none.
func (rs *Rules) Match(id map[string]string) *Rule {
	var best *Rule
	for _, r := range rs.rules {
		if len(r.Match) != len(id) || (best != nil && r.exact <= best.exact) {
			continue
		}
		ok := true
		for k, v := range r.Match {
			got, has := id[k]
			if !has || (v != wildcard && v != got) {
				ok = false
				break
			}
		}
		if ok {
			best = r
		}
	}
	return best
}

// checkID checks a bucket id's size.
func checkID(id map[string]string) error {
	if len(id) == 0 || len(id) > MaxIDEntries {
		return fmt.Errorf("a bucket id of %d entries; 1 to %d", len(id), MaxIDEntries)
	}
	for k, v := range id {
		if len(k) == 0 || len(k) > MaxIDBytes || len(v) > MaxIDBytes {
			return fmt.Errorf("a bucket id entry of %d and %d bytes; keys 1 to %d, values up to %d", len(k), len(v), MaxIDBytes, MaxIDBytes)
		}
	}
	return nil
}

// idKey is a bucket id as one string: its entries sorted, each key and value ended by a 0 byte
// (which neither holds as Envoy builds them; if one does, the length prefix keeps it apart).
func idKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b := make([]byte, 0, 64)
	for _, k := range keys {
		b = fmt.Appendf(b, "%d:%s%d:%s", len(k), k, len(id[k]), id[k])
	}
	return string(b)
}

// ledgerName is a bucket's name in the ledger: its rule's and a hash of its id, so that no value
// an Envoy reports (a user's id, a key) is ever part of a Redis key.
func ledgerName(rule string, key string) string {
	sum := sha256.Sum256([]byte(key))
	return rule + "." + hex.EncodeToString(sum[:])[:bucketHashLen]
}

// SplitName splits a bucket's ledger name (Options.Ledgers's) into its rule's name, the group its
// ledger is in (store/redis's GroupLedger, ledger.MemoryGroup: a bucket seen for the first time
// does not begin in learning mode, while all of a rule's do after a flush), and the bucket's hash.
func SplitName(name string) (rule, bucket string) {
	if len(name) <= bucketHashLen+1 {
		return name, ""
	}
	return name[:len(name)-bucketHashLen-1], name[len(name)-bucketHashLen:]
}

// Shown is a bucket id as stats show it: a rule's exact values as they are, every value a
// wildcard matched as the start of its SHA-256 (it may be a user's id or a key).
func (r *Rule) shown(id map[string]string) map[string]string {
	out := make(map[string]string, len(id))
	for k, v := range id {
		if r != nil && r.Match[k] == v {
			out[k] = v
			continue
		}
		sum := sha256.Sum256([]byte(v))
		out[k] = "sha256:" + hex.EncodeToString(sum[:])[:12]
	}
	return out
}

// margin is the time an assignment is given to reach its Envoy: the ledger keeps counting an
// allotment that long after its lease ended, and a shrink is confirmed that long after it was
// sent. A second, or the report interval if shorter.
func (rs *Rules) margin() time.Duration { return min(deliveryMargin, rs.quota.ReportInterval) }

// options are the ledger's options of a limit rule: its limit, the assignment's time to live as
// the lease, the delivery margin as the hold, no floor (an Envoy without an assignment follows
// its no_assignment_behavior, which docs/envoy.md says how to set), and up to 1024 Envoys (a
// bucket's limit is at most 2^32 − 1, far below the ledger's bound for that many).
func (rs *Rules) options(r *Rule) ledger.Options {
	return ledger.Options{Limit: r.Limit, Regions: 1, Lease: rs.quota.TTL, Algorithm: rs.algo, Hold: rs.margin(), Clients: ledger.MaxClients}
}
