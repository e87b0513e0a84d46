package gateway

import (
	"context"
	"log/slog"

	"github.com/sluicehq/sluice"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// openRedis opens the Redis store of opts. A gateway serves even while Redis does not answer (a
// restart during a Redis outage would otherwise take the gateway down too): the store itself
// connects in the background, answering every decision ErrStoreUnavailable until it has — so the
// configured failure mode decides (fail-closed: 503; fail-open; local) and /readyz says not
// ready — and logs to log when Redis did not answer and when it does. Errors that retrying
// cannot mend (a bad option, a Redis that refuses the connection) are returned.
func openRedis(opts redisstore.Options, log *slog.Logger) (sluice.Store, func(context.Context) error, func(), error) {
	opts.Logger = log
	rs, err := redisstore.New(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	return rs, rs.Ping, rs.Close, nil
}
