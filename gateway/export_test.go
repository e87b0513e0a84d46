package gateway

import "time"

// SetUpstreamIdle sets how long the upstream may be silent, for a test; it returns the old value.
func SetUpstreamIdle(d time.Duration) time.Duration {
	old := upstreamIdle
	upstreamIdle = d
	return old
}

// SetHeaderTimeout sets how long the listener waits for a request's header, for a test; it
// returns the old value.
func SetHeaderTimeout(d time.Duration) time.Duration {
	old := headerTimeout
	headerTimeout = d
	return old
}
