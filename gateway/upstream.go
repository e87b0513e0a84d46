package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Upstream is the connections to one upstream (a scheme and a host): the fasthttp engine's
// HostClient and the net/http engine's Transport. A reload that keeps the upstream's scheme and
// host keeps its connections (see Upstream.For).
type Upstream struct {
	scheme, host string
	path         string // the upstream URL's path, joined in front of every request's; "" for none
	client       *fasthttp.HostClient
	transport    *http.Transport
}

// Timeouts towards the upstream. idleTimeout bounds silence, not length: a response that keeps
// streaming (server-sent events, a large download) is never cut, one that stops for a minute is.
const (
	dialTimeout      = 5 * time.Second
	maxUpstreamConns = 4096
)

var upstreamIdle = 60 * time.Second // a variable for the tests

// For returns the connections for u: up itself if it already connects to u's scheme and host
// (only the path may differ), else new ones. A nil up makes new ones.
func (up *Upstream) For(u *url.URL) *Upstream {
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	if up != nil && up.scheme == u.Scheme && up.host == u.Host {
		if up.path == p {
			return up
		}
		c := *up
		c.path = p
		return &c
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr = net.JoinHostPort(u.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	return &Upstream{
		scheme: u.Scheme,
		host:   u.Host,
		path:   p,
		client: &fasthttp.HostClient{
			Addr:                     addr,
			IsTLS:                    u.Scheme == "https",
			TLSConfig:                &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12},
			MaxConns:                 maxUpstreamConns,
			MaxIdleConnDuration:      90 * time.Second,
			MaxConnWaitTimeout:       dialTimeout,
			Dial:                     dialIdleTimeout,
			DisablePathNormalizing:   true, // forward the path as the client sent it
			NoDefaultUserAgentHeader: true,
			// Its Do is not used: the engine's calls are upstreamCall's, on its pool.
		},
		transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   dialTimeout,
			ResponseHeaderTimeout: upstreamIdle,
			ExpectContinueTimeout: time.Second,
		},
	}
}

// THE FASTHTTP ENGINE'S CALLS TO THE UPSTREAM. The HostClient is the pool of connections
// (AcquireConn, ReleaseConn, CloseConn); a call is made here, so that
//
//   - a client that leaves cancels its call: the connection it is on is closed (the upstream
//     sees its request cancelled), whether the call waits for the header or streams the body;
//   - a pooled connection the upstream has closed (it restarted, or timed out its idle
//     connections) is taken as stale, and another one is taken, without counting as an attempt:
//     a request that could not be sent again (a POST, a streamed body) asks the socket before
//     anything is written on it (peerClosed, a system call); one that can be sent again does not
//     ask (under load that call was a twentieth of a request's CPU), and is sent again if the
//     pooled connection it was written on turns out closed before any byte of an answer (as
//     net/http's Transport does);
//   - a request that failed on a connection after it was written is sent again only if it is
//     idempotent and has no streamed body, and never after a timeout (asking a silent upstream
//     again would double the wait); at most maxAttempts in all, stale connections aside.
//
// The response's body is the connection's stream (fasthttp frames it: a length, chunked, or to
// the close); the call gives the connection back when the stream is closed (upstreamCall.finish):
// to the pool if the body was read to its end, else closed.
const maxAttempts = 3

var errClientLeft = errors.New("the client left")

// upstreamCall is one request's call to the upstream. Its methods are safe for concurrent use
// (cancel comes from the goroutine that watches the client).
type upstreamCall struct {
	hc *fasthttp.HostClient

	mu      sync.Mutex
	conn    net.Conn // the connection the call is on (nil: none now)
	left    bool     // cancelled: the client left
	release func(reuse bool)

	br *bufio.Reader // the response's connection's reader, while its body is a stream (the caller's goroutine only)
}

// cancel ends the call: the connection it is on is closed (a read or a write on it fails at
// once), and it takes no other.
func (c *upstreamCall) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left = true
	if c.conn != nil {
		_ = c.conn.Close()
	}
}

// use notes that the call is on conn; false if it was cancelled.
func (c *upstreamCall) use(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = conn
	return !c.left
}

// cancelled reports whether the client left.
func (c *upstreamCall) cancelled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.left
}

// finish gives the response's connection back: to the pool if reuse (its body was read to the
// end) and neither side asked to close it, else closed. The response's stream is closed first.
func (c *upstreamCall) finish(resp *fasthttp.Response, reuse bool) {
	_ = resp.CloseBodyStream()
	c.br = nil
	c.mu.Lock()
	release := c.release
	c.release, c.conn = nil, nil
	reuse = reuse && !c.left
	c.mu.Unlock()
	if release != nil {
		release(reuse && !resp.ConnectionClose())
	}
}

// do sends req and reads the header of its response into resp (its body is resp's stream: the
// caller closes it with finish). It tries again as the package comment says.
func (c *upstreamCall) do(req *fasthttp.Request, resp *fasthttp.Response) error {
	req.URI().DisablePathNormalizing = true // forward the path as the client sent it
	h := &req.Header
	again := !req.IsBodyStream() && (h.IsGet() || h.IsHead() || h.IsOptions() || h.IsPut() || h.IsDelete() || h.IsTrace())
	var err error
	for attempt, stale := 1, 0; ; attempt++ {
		var retry bool
		retry, err = c.once(req, resp, again)
		if err == errStale && stale < maxUpstreamConns {
			stale, attempt = stale+1, attempt-1 // a dead pooled connection (closed now) is not an attempt
		}
		if err == nil || !retry || attempt >= maxAttempts || c.cancelled() {
			break
		}
	}
	if err == io.EOF {
		err = fasthttp.ErrConnectionClosed
	}
	if c.cancelled() {
		err = errClientLeft
	}
	return err
}

// errStale is a pooled connection the upstream had closed, found before anything was written.
var errStale = errors.New("the upstream had closed the connection")

// once is one attempt: it reports whether another may be made.
func (c *upstreamCall) once(req *fasthttp.Request, resp *fasthttp.Response, again bool) (retry bool, err error) {
	hc := c.hc
	resp.Reset()
	resp.StreamBody = true
	cc, err := hc.AcquireConn(0, false)
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if !c.use(conn) {
		hc.CloseConn(cc)
		return false, errClientLeft
	}
	fail := func() {
		c.use(nil)
		hc.CloseConn(cc)
	}
	// Nothing written yet: safe to send again, whatever the request. A request that cannot be sent
	// again (again false: a POST, a streamed body) asks the socket; one that can finds out by
	// sending (below).
	if !again && peerClosed(conn) {
		fail()
		return true, errStale
	}
	reused := !cc.LastUseTime().IsZero() // (fasthttp notes a connection's use when it is given back)
	resp.ParseNetConn(conn)
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		fail()
		if again && reused && closedBeforeAnswer(err) {
			return true, errStale
		}
		return again && !isTimeout(err), err
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	br := hc.AcquireReader(conn)
	if err = resp.ReadLimitBody(br, 0); err != nil {
		hc.ReleaseReader(br)
		fail()
		if again && reused && closedBeforeAnswer(err) {
			return true, errStale // a kept-alive connection the upstream had closed
		}
		return again && !isTimeout(err), err
	}
	release := func(reuse bool) {
		hc.ReleaseReader(br)
		if reuse {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
	}
	if resp.BodyStream() == nil { // no body (HEAD, 204, 304): the connection is free now
		c.use(nil)
		release(!req.ConnectionClose() && !resp.ConnectionClose())
		return false, nil
	}
	c.mu.Lock()
	c.release = release
	c.mu.Unlock()
	c.br = br
	return false, nil
}

// inHand returns the length of resp's body if every byte of it has already been read from the
// upstream's connection (its length is known, and it is in the reader's buffer), else -1: such a
// body can be taken whole at once, without waiting on the upstream.
func (c *upstreamCall) inHand(resp *fasthttp.Response) int {
	n := resp.Header.ContentLength()
	if n < 0 || c.br == nil || n > c.br.Buffered() {
		return -1
	}
	return n
}

// dialIdleTimeout dials the upstream with a connection whose reads and writes each have
// upstreamIdle to make progress.
func dialIdleTimeout(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, err
	}
	return &idleConn{Conn: c}, nil
}

// idleConn bounds each read and write, not the whole exchange. Moving a deadline costs a timer
// update, so it is moved only once it is a sixtieth of upstreamIdle stale: an upstream gets
// between 59/60 of upstreamIdle and upstreamIdle of silence. A connection is used by one request
// at a time.
type idleConn struct {
	net.Conn
	readSet, writeSet time.Time // when each deadline was last moved
}

func (c *idleConn) Read(b []byte) (int, error) {
	now := time.Now()
	if now.Sub(c.readSet) > upstreamIdle/60 {
		c.readSet = now
		_ = c.Conn.SetReadDeadline(now.Add(upstreamIdle))
	}
	return c.Conn.Read(b)
}

// closedBeforeAnswer reports whether err is the upstream's connection found closed (or reset)
// before any byte of an answer: what a kept-alive connection the upstream had closed gives.
func closedBeforeAnswer(err error) bool {
	return err == io.EOF || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// NetConn returns the connection under c (for peerClosed, under a *tls.Conn).
func (c *idleConn) NetConn() net.Conn { return c.Conn }

func (c *idleConn) Write(b []byte) (int, error) {
	if now := time.Now(); now.Sub(c.writeSet) > upstreamIdle/60 {
		c.writeSet = now
		_ = c.Conn.SetWriteDeadline(now.Add(upstreamIdle))
	}
	return c.Conn.Write(b)
}

// dial opens a connection of its own to the upstream (for a tunnel).
func (up *Upstream) dial() (net.Conn, error) {
	c, err := net.DialTimeout("tcp", up.client.Addr, dialTimeout)
	if err != nil || !up.client.IsTLS {
		return c, err
	}
	t := tls.Client(c, up.client.TLSConfig)
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := t.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return t, nil
}
