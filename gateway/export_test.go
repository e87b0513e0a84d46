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

// SetAdminTimeouts sets the admin listener's bound on a whole request, on an answer and on an
// idle connection (its header's is SetHeaderTimeout's), for a test; it returns a function that
// puts the old ones back. Like SetHeaderTimeout, it applies to servers made after it.
func SetAdminTimeouts(read, write, idle time.Duration) (restore func()) {
	r, w, i := adminReadTimeout, adminWriteTimeout, idleTimeout
	adminReadTimeout, adminWriteTimeout, idleTimeout = read, write, idle
	return func() { adminReadTimeout, adminWriteTimeout, idleTimeout = r, w, i }
}
