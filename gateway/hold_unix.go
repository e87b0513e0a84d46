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
//
// It moves the socket's read deadline; the caller puts the body's back (restartBody).
func watchClose(conn net.Conn, deadline time.Time) bool {
	return watchCloseArmed(conn, func(socket net.Conn) bool { return socket.SetReadDeadline(deadline) == nil })
}

// watchCloseArmed is watchClose with the deadline set by arm on the socket (false: do not
// watch), so that a caller can stop the watch under a lock of its own (clientWatch).
func watchCloseArmed(conn net.Conn, arm func(socket net.Conn) bool) bool {
	conn = socketOf(conn) // *tls.Conn, bodyConn: watch the socket under them
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	if !arm(conn) {
		return true
	}
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

// peerClosed reports whether conn's peer has closed it (or reset it), without waiting and
// without reading: for a pooled connection, before a request is written on it.
func peerClosed(conn net.Conn) bool {
	sc, ok := socketOf(conn).(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	_ = raw.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (err == nil && n == 0) || (err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR))
	})
	return closed
}
