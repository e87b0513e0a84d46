package main

import (
	"testing"

	"github.com/sluicehq/sluice/config"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// The configuration's defaults of the Redis store's timeouts are the store's own: a file that
// leaves them out and a program that leaves Options' out behave alike.
func TestStoreTimeoutDefaults(t *testing.T) {
	if config.DefaultStoreTimeout != redisstore.DefaultTimeout || config.DefaultSlowTimeout != redisstore.DefaultSlowTimeout {
		t.Errorf("config's timeout %v and slow_timeout %v; the Redis store's Timeout %v and SlowTimeout %v",
			config.DefaultStoreTimeout, config.DefaultSlowTimeout, redisstore.DefaultTimeout, redisstore.DefaultSlowTimeout)
	}
}

// The region section's bounds are the Redis ledger's own: a file config accepts is one the
// ledger takes.
func TestRegionBounds(t *testing.T) {
	if config.MaxRegions != redisstore.MaxLedgerRegions || config.MaxGlobalLimit != redisstore.MaxLedgerLimit {
		t.Errorf("config's regions ≤ %d and global limit ≤ %d; the ledger's %d and %d",
			config.MaxRegions, int64(config.MaxGlobalLimit), redisstore.MaxLedgerRegions, int64(redisstore.MaxLedgerLimit))
	}
}
