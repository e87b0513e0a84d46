package config

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// DefaultLease is a concurrency policy's lease when it sets none: how long a slot is held
// without renewal. The gateway renews its requests' leases every third of it, so it only bounds
// how long the slots of an instance that died stay taken.
const DefaultLease = 30 * time.Second

// lease reads the lease of a concurrency policy (its Period; the policy has no period), or
// reports a lease on another algorithm, and reads that one's period as policies does. It reports
// whether what it read is good.
func (p *parser) lease(pol *Policy, path string, periodN, leaseN *yaml.Node) bool {
	if pol.Algorithm != sluice.Concurrency {
		if pol.Algorithm != 0 { // (an unknown algorithm is reported already)
			p.errorf(leaseN, path, nil, "lease has no meaning for %v (only concurrency holds slots under a lease; the others take a period)", pol.Algorithm)
		}
		if periodN != nil {
			if d, ok := p.duration(periodN, path, "period"); ok {
				pol.Period = d
			}
		}
		return false
	}
	good := true
	if periodN != nil {
		p.errorf(periodN, path, nil, "period has no meaning for concurrency: it counts requests in flight, not in a window (set lease: how long a slot is held without renewal, default %v)", DefaultLease)
		good = false
	}
	pol.Period = DefaultLease
	if leaseN == nil {
		return good
	}
	d, ok := p.duration(leaseN, path, "lease")
	if !ok {
		return false
	}
	if d < algorithm.MinPeriod || d%time.Microsecond != 0 {
		p.errorf(leaseN, path, nil, "lease %v must be ≥ 1ms and a whole number of microseconds", d)
		return false
	}
	pol.Period = d
	return good
}
