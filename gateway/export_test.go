package gateway

import "time"

// SetUpstreamIdle sets how long the upstream may be silent, for a test; it returns the old value.
func SetUpstreamIdle(d time.Duration) time.Duration {
	old := upstreamIdle
	upstreamIdle = d
	return old
}
