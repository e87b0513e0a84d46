package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Change is a change of the policy at an instant of virtual time, as a configuration reload
// makes it: from TMicros on, the session decides under the changed numbers, on the same store
// and under the same policy name. So the rules of a reload apply (docs/design.md, "State and
// reloads"): a changed limit or burst keeps what was used (a window's count, a bucket's units in
// use). The browser simulation's live mode records one whenever its limit or burst is changed
// while the clock runs, and `sluice simulate --change` replays it.
type Change struct {
	TMicros int64
	Limit   int64 // 0: unchanged
	Burst   int64 // with SetBurst; only the two buckets take it, the others ignore it
	// SetBurst: Burst replaces the policy's burst (0 is a burst too).
	SetBurst bool
}

// ParseChange reads a change as "t=30s,limit=20,burst=5": t, a Go duration of whole µs, and
// at least one of limit (> 0) and burst (≥ 0). Its error names the part at fault.
func ParseChange(text string) (Change, error) {
	var c Change
	seen := map[string]bool{}
	for _, part := range strings.Split(text, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || seen[k] {
			return c, fmt.Errorf("%q: want t=D and limit=N or burst=N, each once, separated by commas (t=30s,limit=20)", text)
		}
		seen[k] = true
		var err error
		switch k {
		case "t":
			var d time.Duration
			d, err = time.ParseDuration(v)
			if err == nil && (d < 0 || d%time.Microsecond != 0 || d > MaxTimeMicros*time.Microsecond) {
				err = fmt.Errorf("must be a whole number of µs from 0 to 2^53 µs")
			}
			c.TMicros = int64(d / time.Microsecond)
		case "limit":
			c.Limit, err = strconv.ParseInt(v, 10, 64)
			if err == nil && c.Limit <= 0 {
				err = fmt.Errorf("must be > 0")
			}
		case "burst":
			c.Burst, err = strconv.ParseInt(v, 10, 64)
			c.SetBurst = true
			if err == nil && c.Burst < 0 {
				err = fmt.Errorf("must be ≥ 0")
			}
		default:
			return c, fmt.Errorf("%q: unknown %q (want t, limit, burst)", text, k)
		}
		if err != nil {
			return c, fmt.Errorf("%s=%s: %v", k, v, err)
		}
	}
	if !seen["t"] || c.Limit == 0 && !c.SetBurst {
		return c, fmt.Errorf("%q: want t=D and limit=N or burst=N (t=30s,limit=20)", text)
	}
	return c, nil
}

// String writes c as ParseChange reads it.
func (c Change) String() string {
	s := "t=" + FormatDuration(c.TMicros)
	if c.Limit != 0 {
		s += ",limit=" + strconv.FormatInt(c.Limit, 10)
	}
	if c.SetBurst {
		s += ",burst=" + strconv.FormatInt(c.Burst, 10)
	}
	return s
}

// Apply returns p with c's numbers.
func (c Change) Apply(p sluice.Policy) sluice.Policy {
	if c.Limit != 0 {
		p.Limit = c.Limit
	}
	if c.SetBurst && TakesBurst(p.Algorithm) {
		p.Burst = c.Burst
	}
	return p
}

// changeTo applies, before the session decides or peeks at tMicros, the changes due by then:
// the limiter is replaced by one of the changed policy on the same store.
//
// The change takes effect at its own instant, whenever the next call comes: each key's state is
// read under the new policy at c's time (a peek, cost 0), which converts what the old policy left
// then (a bucket's queue or tokens, carried over to the new rate: algorithm's State.adopt). So the
// outcome does not depend on when the next request or peek comes after the change — a run that
// peeks at every time slice (the browser page's) decides as `sluice simulate --change` does.
func (s *Session) changeTo(tMicros int64) error {
	for len(s.changes) > 0 && s.changes[0].TMicros <= tMicros {
		c := s.changes[0]
		p := c.Apply(s.limiter.Policy())
		lim, err := sluice.NewLimiter(s.limiter.Store(), p)
		if err != nil {
			return fmt.Errorf("sim: change %s: %w", c, err)
		}
		s.limiter, s.changes = lim, s.changes[1:]
		if len(s.keys) > 0 {
			s.clock.Set(time.UnixMicro(s.origin + c.TMicros))
			for _, key := range s.keys {
				if _, err := lim.AllowN(s.ctx, key, 0); err != nil {
					return fmt.Errorf("sim: change %s, key %q: %w", c, key, err)
				}
			}
		}
	}
	if len(s.changes) == 0 {
		s.keys, s.known = nil, nil
	}
	return nil
}

// seen records key while changes are to come (see changeTo).
func (s *Session) seen(key string) {
	if len(s.changes) == 0 {
		return
	}
	if s.known == nil {
		s.known = map[string]bool{}
	}
	if !s.known[key] {
		s.known[key] = true
		s.keys = append(s.keys, key)
	}
}
