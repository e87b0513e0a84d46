package redis

// The fleet's history: the last hour of the fleet's figures, for the operator page's chart. The
// gateway divides time into slots (unix seconds / 10, the same on every instance) and, as each
// slot ends, sets its own counts in the slot's key in Redis (a sorted set of every instance's
// counts, by instance and name); any instance reads the fleet's hour back from them, summed.
//
// Bounded: one key a slot, named by its number only (no client's name or key is in a key's name),
// each expiring HistoryTTL after its last add, so Redis holds the last hour and a little more
// (at most 373 keys at 10 s a slot), whatever the number of instances. Each key's counts are what
// the instances set: the gateway sets a few counts and its 5 most refused clients' (by name), so
// a slot's counts grow with the instances, not with the clients. The keys are beside the registry,
// in its slot (its hash tag), under the store's prefix (rate-limit:{rate-limit:instances}:
// history:<slot> with the default prefix and fleet), and take only commands the store's ACL
// grants (ACLRules).

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

//go:embed history.lua
var historyLua string

var historyScript = rueidis.NewLuaScript(historyLua)

// HistoryTTL is how long a slot's key lives after its last add: an hour and a little more.
const HistoryTTL = time.Hour + 2*time.Minute

// MaxHistorySlots bounds the slots one read asks for (an hour of 10 s slots).
const MaxHistorySlots = 360

// errNoHistory: the prefix has a '}' without a hash tag, so no key can share the registry's slot.
var errNoHistory = errors.New("redis store: fleet history: no key can share the registry's slot under this prefix (a '}' without a hash tag)")

// historyKey is the key of slot n: beside the registry, in its slot ("" if none can be).
func (f *Fleet) historyKey(n int64) string {
	return sharesKey(f.s.prefix, f.key, ":history:"+strconv.FormatInt(n, 10))
}

// AddHistory sets this instance's counts (field: value) in the fleet's slot n, and keeps its key
// for HistoryTTL from now. The slot keeps each instance's counts apart (members "<id> <field>")
// and History sums them, so an add is idempotent: sent again after its answer was lost, or
// retried after an outage, it counts once. Field names are the caller's (the gateway's: counts
// and client names; never put a secret in one).
func (f *Fleet) AddHistory(ctx context.Context, n int64, counts map[string]int64) error {
	key := f.historyKey(n)
	if key == "" {
		return errNoHistory
	}
	c, err := f.s.connected()
	if err != nil {
		return err
	}
	args := []string{"add", strconv.FormatInt(HistoryTTL.Milliseconds(), 10)}
	for k, v := range counts {
		args = append(args, f.id+" "+k, strconv.FormatInt(v, 10))
	}
	if err := historyScript.Exec(ctx, c.client, []string{key}, args).Error(); err != nil {
		return unavailable(err)
	}
	return nil
}

// History reads the fleet's slots first to last (at most MaxHistorySlots), each slot that holds
// anything by its number, with its fields.
func (f *Fleet) History(ctx context.Context, first, last int64) (map[int64]map[string]int64, error) {
	if last < first || last-first >= MaxHistorySlots {
		return nil, fmt.Errorf("redis store: fleet history: slots %d to %d; at most %d at once", first, last, MaxHistorySlots)
	}
	keys := make([]string, 0, last-first+1)
	for n := first; n <= last; n++ {
		k := f.historyKey(n)
		if k == "" {
			return nil, errNoHistory
		}
		keys = append(keys, k)
	}
	c, err := f.s.connected()
	if err != nil {
		return nil, err
	}
	reply, err := historyScript.Exec(ctx, c.client, keys, []string{"read"}).ToArray()
	if err != nil {
		return nil, unavailable(err)
	}
	if len(reply) != len(keys) {
		return nil, fmt.Errorf("redis store: fleet history: %d slots read, want %d", len(reply), len(keys))
	}
	out := map[int64]map[string]int64{}
	for i, r := range reply {
		kv, err := r.AsStrSlice()
		if err != nil || len(kv)%2 != 0 {
			return nil, fmt.Errorf("redis store: fleet history: slot %d: %v", first+int64(i), err)
		}
		if len(kv) == 0 {
			continue
		}
		m := make(map[string]int64, len(kv)/2)
		for j := 0; j < len(kv); j += 2 {
			v, err := strconv.ParseFloat(kv[j+1], 64) // (a score: an integer below 2^53, exact)
			if err != nil {
				return nil, fmt.Errorf("redis store: fleet history: slot %d, field %q: %v", first+int64(i), kv[j], err)
			}
			// "<instance id> <field>": the instances' counts of a field summed (a member without
			// an id, "<field>", is counted as one instance's).
			_, field, ok := strings.Cut(kv[j], " ")
			if !ok {
				field = kv[j]
			}
			m[field] += int64(v)
		}
		out[first+int64(i)] = m
	}
	return out, nil
}
