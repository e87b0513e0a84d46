//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package gateway

import (
	"net"
	"time"
)

// watchClose cannot watch a connection on this system: a held request is forwarded even if its
// client left (hold waits the whole delay).
func watchClose(conn net.Conn, deadline time.Time) bool { return true }
