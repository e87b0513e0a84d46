//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package gateway

import (
	"net"
	"time"
)

// watchClose cannot watch a connection on this system: a held request is forwarded even if its
// client left (hold waits the whole delay).
func watchClose(conn net.Conn, deadline time.Time) bool { return true }

// watchCloseArmed cannot watch either (a client that leaves is found when writing to it fails).
func watchCloseArmed(conn net.Conn, arm func(socket net.Conn) bool) bool { return true }

// peerClosed cannot tell on this system: a pooled connection the upstream closed is found when
// a request on it fails.
func peerClosed(conn net.Conn) bool { return false }
