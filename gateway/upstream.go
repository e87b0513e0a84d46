package gateway

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"strings"
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
			StreamResponseBody:       true,
			DisablePathNormalizing:   true, // forward the path as the client sent it
			NoDefaultUserAgentHeader: true,
			RetryIfErr:               retryIdempotentOnly,
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

// retryIdempotentOnly retries a request on a fresh connection only when it is idempotent and
// the connection failed before an answer (a kept-alive connection the upstream had closed):
// never a POST, which the upstream may have acted on.
func retryIdempotentOnly(req *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	if isTimeout(err) { // a silent upstream: asking again would double the wait
		return false, false
	}
	h := &req.Header
	return false, attempts < 2 && (h.IsGet() || h.IsHead() || h.IsOptions() || h.IsPut() || h.IsDelete() || h.IsTrace())
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
	if now := time.Now(); now.Sub(c.readSet) > upstreamIdle/60 {
		c.readSet = now
		_ = c.Conn.SetReadDeadline(now.Add(upstreamIdle))
	}
	return c.Conn.Read(b)
}

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
