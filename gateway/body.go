package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/answer"
)

// Slow request bodies. A client that sends its body a byte a second must not hold a connection
// (and its memory) for long: the proxy listener gives a body server.body_timeout from the end of
// its header, and every byte that arrives adds 1/server.body_min_rate of a second, never to more
// than body_timeout from now (config.Server). It is enforced on the connection, by moving its
// read deadline as bytes arrive, because fasthttp reads the first part of a body before the
// handler runs, and the rest while the HostClient sends it upstream.

// bodyMarker is the read timeout FastServer's HeaderReceived asks for a request that has a body.
// A bodyConn takes a read deadline that far ahead as the start of a body and gives the body its
// own allowance instead; on a connection that is not a bodyConn the body gets the hour. No other
// deadline the server sets is anywhere near bodyMarkerMin: the header's is headerTimeout, the
// idle one idleTimeout.
const (
	bodyMarker    = time.Hour
	bodyMarkerMin = 30 * time.Minute
)

// bodyListener hands out bodyConns with the body allowance of the configuration that runs when
// each is accepted (a reload applies to new connections).
type bodyListener struct {
	net.Listener
	s *Server
}

func (l bodyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cfg := l.s.cfg.Load().Server
	return &bodyConn{Conn: c, grace: cfg.BodyTimeout, rate: cfg.BodyMinRate}, nil
}

// bodyConn is a proxy connection that enforces the body allowance. Its fields belong to the
// connection's goroutine (fasthttp serves a connection on one), which is the only one that reads
// it or sets its read deadline until the connection is hijacked, and a hijack clears the
// deadline (SetDeadline), which ends the body.
type bodyConn struct {
	net.Conn
	grace time.Duration // body_timeout
	rate  int64         // body_min_rate, bytes per second; 0: no extension

	body     bool      // a request's body is being read
	deadline time.Time // while body: the read deadline, moved as bytes arrive
	timedOut bool      // a read of the body ran out of its allowance
}

// SetReadDeadline is the server's: the body marker starts a body, any other deadline ends it.
func (c *bodyConn) SetReadDeadline(t time.Time) error {
	now := time.Now()
	if !t.IsZero() && t.Sub(now) > bodyMarkerMin {
		c.body, c.timedOut, c.deadline = true, false, now.Add(c.grace)
		return c.Conn.SetReadDeadline(c.deadline)
	}
	c.body = false
	return c.Conn.SetReadDeadline(t)
}

func (c *bodyConn) SetDeadline(t time.Time) error {
	c.body = false
	return c.Conn.SetDeadline(t)
}

func (c *bodyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.body {
		return n, err
	}
	if n > 0 && c.rate > 0 {
		now := time.Now()
		d := c.deadline.Add(time.Duration(int64(n) * int64(time.Second) / c.rate))
		if limit := now.Add(c.grace); d.After(limit) {
			d = limit
		}
		if d.After(c.deadline) {
			c.deadline = d
			if e := c.Conn.SetReadDeadline(d); e != nil && err == nil {
				err = e
			}
		}
	}
	if err != nil && isTimeout(err) {
		c.timedOut = true
	}
	return n, err
}

// restart gives the body its allowance again from now: a held request's body waited while the
// hold watched the socket (and moved its deadline).
func (c *bodyConn) restart() error {
	c.timedOut, c.deadline = false, time.Now().Add(c.grace)
	return c.Conn.SetReadDeadline(c.deadline)
}

// NetConn returns the connection under c (for watchClose, and for a *tls.Conn's own NetConn).
func (c *bodyConn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection under c, for a tunnel (see closeWrite).
func (c *bodyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// bodyConnOf finds the bodyConn under conn (under a *tls.Conn, say); nil if there is none.
func bodyConnOf(conn net.Conn) *bodyConn {
	for conn != nil {
		if bc, ok := conn.(*bodyConn); ok {
			return bc
		}
		nc, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		conn = nc.NetConn()
	}
	return nil
}

// socketOf is the connection at the bottom of conn's wrappers (a *tls.Conn, a bodyConn).
func socketOf(conn net.Conn) net.Conn {
	for {
		nc, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			return conn
		}
		conn = nc.NetConn()
	}
}

// restartBody gives conn's body its allowance again after a hold, which moved the socket's
// read deadline; a connection that is not a bodyConn gets the default allowance.
func restartBody(conn net.Conn, grace time.Duration) {
	if bc := bodyConnOf(conn); bc != nil {
		_ = bc.restart()
		return
	}
	_ = socketOf(conn).SetReadDeadline(time.Now().Add(grace))
}

// clientBody is a request's body as the upstream is sent it. It keeps the error of reading it
// from the client, so that a forward that failed can tell the client's fault (a malformed or
// stalled body: 400, 408) from the upstream's (502, 504). The net/http engine's Transport reads
// it on a goroutine of its own, hence the lock.
type clientBody struct {
	r      io.Reader
	closer io.Closer // the net/http engine's body; nil for fasthttp's stream, which its server owns

	mu  sync.Mutex
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

// failed is the error reading the body from the client met, if any.
func (b *clientBody) failed() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// netBody is a clientBody for the net/http engine, which closes what it reads.
type netBody struct{ *clientBody }

func (b netBody) Close() error { return b.closer.Close() }

// clientBodyFailed counts nothing as the upstream's: the request's own body could not be read.
// It logs the client's address and what was wrong, and answers 408 if the body came too slowly,
// else 400 (a malformed chunked body, or a client that left in the middle of it).
func (g *Gateway) clientBodyFailed(peer string, timedOut bool, err error) answer.Problem {
	status, what := http.StatusBadRequest, "the request's body could not be read: "+describeReadError(err)
	if timedOut || isTimeout(err) {
		status = http.StatusRequestTimeout
		what = fmt.Sprintf("the request's body stopped coming, or came slower than %d bytes a second for %v (server.body_timeout, server.body_min_rate)",
			g.cfg.Server.BodyMinRate, g.cfg.Server.BodyTimeout)
	}
	g.metrics.malformed.warn(peer, what)
	return answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(status), Status: status, Detail: what}
}

// describeReadError says what was wrong with a request that could not be read, in words of its
// own: fasthttp's error texts can quote the request, and with it a credential.
func describeReadError(err error) string {
	var small *fasthttp.ErrSmallBuffer
	var chunk fasthttp.ErrBrokenChunk
	var op *net.OpError
	switch {
	case err == nil:
		return "unknown"
	case errors.As(err, &small):
		return fmt.Sprintf("the header is over %d KiB", maxHeaderBytes>>10)
	case isTimeout(err):
		return "it did not arrive in time"
	case errors.As(err, &chunk), errors.Is(err, fasthttp.ErrBadTrailer):
		return "malformed chunked encoding"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the client closed the connection before its end"
	case errors.As(err, &op):
		return "the connection failed (" + op.Op + ")"
	case isChunkError(err):
		return "malformed chunked encoding"
	}
	// fasthttp's messages start with fixed words ("malformed mime header", "unsupported http
	// version") and quote the request after them: keep the words.
	msg := err.Error()
	for _, p := range []string{"error when reading request headers: ", "fasthttp: ", "tls: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	n := strings.IndexFunc(msg, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == ' ' || r == '-') })
	if n >= 0 {
		msg = msg[:n]
	}
	if msg = strings.TrimSuffix(strings.TrimSpace(msg), " in"); msg == "" || len(msg) > 80 {
		return "not valid HTTP/1.1"
	}
	return "not valid HTTP/1.1 (" + msg + ")"
}

// isChunkError reports fasthttp's and the net/http server's errors for a malformed chunked body
// that have no exported type (their texts are fixed and quote nothing).
func isChunkError(err error) bool {
	switch err.Error() {
	case "empty hex number", "too large hex number", // fasthttp's chunk size
		"invalid byte in chunk length", "malformed chunked encoding", "http chunk length too large",
		"empty hex number for chunk length", "chunked line ends with bare LF", "invalid CR in chunked line",
		"header line too long", "chunked encoding contains too much non-data":
		return true
	}
	return false
}

// forwardFailed is the net/http engine's answer to a request it could not forward: the client's
// fault if reading its body failed, else the upstream's.
func (g *Gateway) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left (which cancelled the upstream's request): no one to answer, nothing the upstream did
	}
	var p answer.Problem
	if nb, ok := r.Body.(netBody); ok && nb.failed() != nil {
		w.Header().Set("Connection", "close")
		p = g.clientBodyFailed(r.RemoteAddr, false, nb.failed())
	} else {
		p = g.upstreamFailed(err)
	}
	if e := endOf(r); e != nil {
		e.replyHTTP(w, p)
		return
	}
	answer.WriteProblem(w, p)
}
