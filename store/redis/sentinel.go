package redis

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"
)

// Sentinel names the primary through Redis Sentinel (Options.Sentinel): the sentinels that
// monitor it, under the master name they know it by.
//
// The store asks the sentinels for the primary's address when it connects, subscribes to their
// +switch-master events, and re-asks them every sentinelRefresh as well (so that a missed event
// cannot leave it on a demoted primary): after a failover, decisions go to the new primary
// without a restart. Until they do — from the primary's death until the sentinels have promoted
// a replica and the store has switched, about down-after-milliseconds plus the election — every
// decision fails with ErrStoreUnavailable and the failure mode decides. The scripts are re-sent
// (NOSCRIPT: EVAL) to a primary that never ran them.
type Sentinel struct {
	Master   string   // the master name the sentinels monitor (sentinel monitor NAME ...)
	Addrs    []string // the sentinels' host:port; the client learns the others from them
	Username string   // the sentinels' own ACL user, if they require one
	Password string   // the sentinels' own password (requirepass), if they require one
}

// sentinelRefresh is how often the store re-asks the sentinels which server is the primary,
// besides following their events.
const sentinelRefresh = time.Second

// sentinelOption fills co for opts.Sentinel, refusing it beside Addrs or URL.
func sentinelOption(co *rueidis.ClientOption, opts *Options) error {
	sn := opts.Sentinel
	switch {
	case len(opts.Addrs) > 0 || opts.URL != "":
		return errors.New("redis store: give Sentinel or Addrs or URL, not several (with Sentinel, the sentinels name the primary)")
	case sn.Master == "":
		return errors.New("redis store: Sentinel.Master is empty (the master name the sentinels monitor)")
	case len(sn.Addrs) == 0:
		return errors.New("redis store: Sentinel.Addrs is empty (the sentinels' host:port)")
	}
	if err := checkAddrs("Sentinel.Addrs", sn.Addrs); err != nil {
		return err
	}
	co.InitAddress = sn.Addrs
	co.Sentinel.MasterSet = sn.Master
	co.Sentinel.Username = sn.Username
	co.Sentinel.Password = sn.Password
	co.Sentinel.TLSConfig = opts.TLS
	co.Sentinel.TopologyRefreshInterval = sentinelRefresh
	return nil
}

// where names what the store connects to, for errors and logs.
func (s *Store) where() string {
	if m := s.co.Sentinel.MasterSet; m != "" {
		return fmt.Sprintf("the primary %q of the sentinels %v", m, s.co.InitAddress)
	}
	return fmt.Sprint(s.co.InitAddress)
}
