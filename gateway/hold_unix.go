//go:build linux || darwin || freebsd || netbsd || openbsd

package gateway

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// watchClose waits until deadline for conn's peer to close it, without reading from it (the
// server reads the connection's next request from its own buffer): it asks the kernel to be
// woken when the socket is readable, and peeks. It returns false if the peer closed (or reset)
// the connection, true at the deadline. It returns true early when it cannot tell: the peer sent
// more (a pipelined request, or TLS records) before the deadline, or conn is not a socket.
func watchClose(conn net.Conn, deadline time.Time) bool {
	if nc, ok := conn.(interface{ NetConn() net.Conn }); ok { // *tls.Conn: watch the socket under it
		conn = nc.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	if conn.SetReadDeadline(deadline) != nil {
		return true
	}
	// Ours replaces the server's, which bounded the read of the request's body (bodyTimeout, see
	// FastServer): put a bound of that length back. (The server sets its own again before it reads
	// the next request.)
	defer conn.SetReadDeadline(time.Now().Add(bodyTimeout))
	gone := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			return false // nothing yet: sleep until the socket is readable or the deadline
		case err != nil, n == 0:
			gone = true // reset, or the end of the stream: the client closed
		}
		return true
	})
	if gone {
		return false
	}
	return true
}
