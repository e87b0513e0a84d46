package envoyconf

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Entry is one entry of a request's descriptor (RateLimitDescriptor.Entry).
type Entry struct{ Key, Value string }

// Override is a request descriptor's own limit (RateLimitDescriptor.limit), which Envoy sends
// when its route says so: RequestsPerUnit per UnitMultiplier units ("3 per 60 seconds"). A
// UnitMultiplier of 0 (the field not sent) is 1.
type Override struct {
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
}

// maxOverridePeriod bounds an override's window (unit × unit_multiplier): 100 years of 365 days.
const maxOverridePeriod = 100 * 365 * 24 * time.Hour

// Validate reports an Override whose unit is not one of Second ... Week, or whose window (unit ×
// unit_multiplier) is over 100 years. Match ignores such an override (the configuration decides
// instead); a server should refuse the request.
func (o Override) Validate() error {
	if !o.Unit.Valid() {
		return fmt.Errorf("limit.unit %d is not a unit (want SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)", int32(o.Unit))
	}
	if o.period() == 0 {
		return fmt.Errorf("limit.unit_multiplier %d: %d %ss is a window over 100 years", o.UnitMultiplier, o.UnitMultiplier, o.Unit)
	}
	return nil
}

// period is the override's window, unit × unit_multiplier; 0 if the unit is not valid or the
// window is over maxOverridePeriod.
func (o Override) period() time.Duration {
	u, n := o.Unit.Duration(), time.Duration(max(o.UnitMultiplier, 1))
	if u == 0 || n > maxOverridePeriod/u {
		return 0
	}
	return u * n
}

// Match is the limit that applies to one descriptor of a request.
//
// How a server applies it, as the reference does:
//   - Unlimited: the descriptor is OK (limit_remaining the largest uint32, no current_limit)
//     and nothing is counted; Key and Policy are empty.
//   - Replaced (see Replaced): the descriptor is OK with no current_limit, and nothing is
//     counted.
//   - ShadowMode: counted as usual, but the descriptor's answer is OK even when it is over the
//     limit.
//   - QuotaMode: counted as usual, but the descriptor never makes the request over the limit:
//     over its limit, its answer is OK with its limit, limit_remaining 0 and no
//     duration_until_reset (the reference's answer at the version sluice is tested against).
//   - RequestsPerUnit 0: every request of a cost above 0 is over the limit (cost 0 is OK); Policy
//     is then not valid (its Limit is 0) and must not be given to a store.
//   - Otherwise Policy, a valid policy, decides on the counter Key.
type Match struct {
	Name           string   // rate_limit.name, if any; "" for an override
	Unlimited      bool     // rate_limit.unlimited: never limited, never counted
	ShadowMode     bool     // shadow_mode: counted, but never refuses
	QuotaMode      bool     // quota_mode
	DetailedMetric bool     // detailed_metric (sluice's metrics never carry request values: Rule is the same)
	Override       bool     // the limit is the request's own (RateLimitDescriptor.limit), not the configuration's
	Replaces       []string // rate_limit.replaces: the names of the limits this one replaces (shared; do not modify)

	// The limit as configured or overridden, for the answer's current_limit. Unit is UnknownUnit
	// for an unlimited descriptor.
	Unit            Unit
	RequestsPerUnit uint32
	// UnitMultiplier is an override's unit_multiplier (1 when it sent none): its window is
	// UnitMultiplier units long. 0 for a configured limit (whose window is one unit).
	UnitMultiplier uint32

	// Policy is what sluice decides with: a fixed window of RequestsPerUnit per Unit.Duration()
	// (times an override's UnitMultiplier),
	// aligned to the epoch as the reference's windows are, or the algorithm (and burst) that
	// sluice's extension names beside rate_limit. Its Name is empty: Key alone names the counter.
	Policy sluice.Policy

	// Key identifies the counter: two descriptors share a counter exactly when the reference makes
	// them share one (see docs/envoy.md), but no request value appears in it. It is
	// domain:rule:hash, where rule is the configured path of keys and values (its characters
	// outside printable ASCII, braces and spaces as '_', cut to 128 bytes, the domain to 64) and
	// hash the hex of the first 16 bytes of a SHA-256 over the domain, the entries' keys and values
	// and the policy. At most 226 bytes, whatever the request.
	Key string

	// Rule names the rule that matched, from configured keys and values only, e.g.
	// "my-domain/key1=value1/key2" (a wildcard as written: "my-domain/path=/api/*"): bounded by
	// the configuration, so fit for a metric label. An override's is its rule's (or the domain's
	// when no rule matches) followed by " (override)".
	Rule string

	// Metadata is the descriptor's metadata (nil if none), which the reference can return in the
	// response's dynamic metadata for the descriptors that pass. Shared; do not modify.
	Metadata map[string]any
}

// Match finds the limit of one descriptor of a request in domain, exactly as the reference does:
// each entry in turn is looked up among the current level's descriptors by its key and value,
// then among their wildcard values ('*' matching any run of characters, in file order), then by
// its key alone (a descriptor without a value); the descriptor reached by the last entry holds the
// limit, so a request descriptor longer or shorter than a rule matches nothing. ok is false when
// no rule applies: the descriptor is not limited (OK, with no current_limit).
//
// With an override (valid: see Override.Validate), the request's own limit applies whenever the
// domain is configured, matching a rule or not, and with none of the rule's settings (no name,
// replaces, shadow mode or unlimited), as the reference applies it. An unknown domain matches
// nothing, override or not.
func (c *Config) Match(domain string, entries []Entry, override *Override) (Match, bool) {
	d := c.domains[domain]
	if d == nil {
		return Match{}, false
	}
	n, share := d.lookup(entries)
	if override != nil && override.period() > 0 {
		m := Match{Override: true, Unit: override.Unit, UnitMultiplier: max(override.UnitMultiplier, 1), RequestsPerUnit: override.RequestsPerUnit,
			Policy: sluice.Policy{Algorithm: sluice.FixedWindow, Limit: int64(override.RequestsPerUnit), Period: override.period()}}
		// The reference's override counter is keyed by the request's own values (no shared wildcard).
		part, rule := "(override)", d.name+" (override)"
		if n != nil {
			part, rule = n.keyPart, n.rule+" (override)"
		}
		m.Key, m.Rule = counterKey(d, part, entries, nil, &m.Policy), rule
		return m, true
	}
	if n == nil {
		return Match{}, false
	}
	l := n.limit
	m := Match{Name: l.name, Unlimited: l.unlimited, ShadowMode: n.shadow, QuotaMode: n.quota,
		DetailedMetric: n.detailed, Replaces: l.replaces, Unit: l.unit, RequestsPerUnit: l.rpu,
		Rule: n.rule, Metadata: n.metadata}
	if !l.unlimited {
		m.Policy = l.policy
		m.Key = counterKey(d, n.keyPart, entries, share, &m.Policy)
	}
	return m, true
}

// lookup walks the tree as the reference's GetLimit does. It returns the descriptor reached by
// the last entry if that descriptor has a rate_limit (else nil), and, for entries that matched a
// share_threshold wildcard, the wildcard value that stands for theirs in the counter's key (nil
// if there are none).
func (d *domain) lookup(entries []Entry) (*node, []string) {
	children, prev := d.root.children, &d.root
	var found *node
	var share []string
	for i, e := range entries {
		fk := e.Key + "_" + e.Value
		next := children[fk]
		wild := ""
		if next == nil {
			for _, w := range prev.wildcards {
				if wildcardMatch(w.parts, fk) {
					next, wild = children[w.key], w.key
					break
				}
			}
		}
		if next == nil {
			next = children[e.Key]
		}
		if wild != "" && next != nil && next.share && next.pattern != "" {
			if share == nil {
				share = make([]string, len(entries))
			}
			share[i] = strings.TrimPrefix(next.pattern, e.Key+"_")
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			found = next
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		children, prev = next.children, next
	}
	return found, share
}

// wildcardMatch reports whether value matches the pattern split at its '*'s into parts: it
// starts with the first part, ends with the last, and holds the others in order in between,
// each '*' matching any run of characters, the empty one included.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	fixed := 0
	for _, p := range parts {
		fixed += len(p)
	}
	if len(value) < fixed || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Bounds of Match.Key's readable parts.
const (
	maxDomainKey = 64
	maxRuleKey   = 128
)

// keyText is s as a key spells it: bytes outside printable ASCII, spaces and braces (which Redis
// Cluster reads as a hash tag) as '_', and at most max bytes, the last a '~' if s was cut. The
// hash beside it tells keys apart; this part is for people.
func keyText(s string, max int) string {
	cut := len(s) > max
	if cut {
		s = s[:max-1]
	}
	b := []byte(s)
	for i, c := range b {
		if c <= ' ' || c >= 0x7f || c == '{' || c == '}' {
			b[i] = '_'
		}
	}
	if cut {
		b = append(b, '~')
	}
	return string(b)
}

// keyVersion starts every hash, so that a change of the encoding changes every key.
const keyVersion = "sluice/envoyconf counter v1\x00"

// counterKey is Match.Key. The hash is over an unambiguous encoding (each string preceded by its
// length) of the domain, the entries (with a shared wildcard value in place of the request's,
// where share_threshold says so, as the reference keys them) and the policy: the reference's
// counter is keyed by the domain, the entries and the window (so the unit); sluice's counter is
// also its policy's, since a store's state under one policy means nothing under another.
//
// It runs for every descriptor of every request, so the encoding is built in a buffer on the
// stack (on the heap only past its 256 bytes) and hashed in one call, and the key is one
// allocation: the same bytes as writing each piece to a hash.Hash, which cost an allocation
// per piece (TestCounterKeysStay pins the keys).
func counterKey(d *domain, part string, entries []Entry, share []string, p *sluice.Policy) string {
	var buf [256]byte
	b := append(buf[:0], keyVersion...)
	b = appendString(b, d.name)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for i, e := range entries {
		b = appendString(b, e.Key)
		if share != nil && share[i] != "" {
			b = appendString(b, share[i])
		} else {
			b = appendString(b, e.Value)
		}
	}
	b = binary.AppendUvarint(b, uint64(p.Algorithm))
	b = binary.AppendUvarint(b, uint64(p.Limit))
	b = binary.AppendUvarint(b, uint64(p.Period))
	b = binary.AppendUvarint(b, uint64(p.Burst))
	sum := sha256.Sum256(b)
	var key strings.Builder
	key.Grow(len(d.keyPart) + len(part) + 2 + 2*16)
	key.WriteString(d.keyPart)
	key.WriteByte(':')
	key.WriteString(part)
	key.WriteByte(':')
	var hx [2 * 16]byte
	hex.Encode(hx[:], sum[:16])
	key.Write(hx[:])
	return key.String()
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// Replaced applies the reference's replaces across the matches of one request's descriptors
// (ms[i] for descriptor i; the zero Match for a descriptor that matched nothing): the names that
// any match replaces (an unlimited one's too) are collected, and every match with one of those
// names is replaced: it is not counted, and its descriptor is OK with no current_limit. An
// unlimited match is never reported replaced: it answers as unlimited either way. Overrides have
// no name and replace nothing.
func Replaced(ms []Match) []bool {
	out := make([]bool, len(ms))
	var replacing map[string]bool
	for _, m := range ms {
		for _, r := range m.Replaces {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			replacing[r] = true
		}
	}
	if replacing == nil {
		return out
	}
	for i, m := range ms {
		out[i] = !m.Unlimited && m.Name != "" && replacing[m.Name]
	}
	return out
}
