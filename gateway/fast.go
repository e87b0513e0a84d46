package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"iter"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/identity"
)

// The fasthttp engine. sluice serve forwards with it because it measured about twice the
// throughput of httputil.ReverseProxy on the same machine (docs/performance.md); the decision path
// (identify, judge) is the one ServeHTTP uses.

// ServeFast is the fasthttp engine's handler: it decides as ServeHTTP does, then forwards the
// request through the upstream's HostClient, holds it, or answers it. The request's end
// (requestEnd, end.go) fires before it returns, or, for a response streamed from the upstream or
// a tunnel, once the stream or the tunnel has ended.
func (g *Gateway) ServeFast(ctx *fasthttp.RequestCtx) {
	// The store gets its own timeouts; the RequestCtx is not a context to hand on (it is
	// recycled when the handler returns, and it is never cancelled by the client leaving).
	dctx := context.Background()
	var span trace.Span
	if g.tracing {
		dctx, span = startSpan(dctx, fastCarrier{&ctx.Request.Header}, string(ctx.Method()), string(ctx.Path()))
	}
	var method, path string
	if g.access != nil {
		method, path = string(ctx.Method()), string(ctx.Path())
	}
	e := g.begin(dctx, span, method, path, true)
	defer e.drop()
	req, v := &e.req, &e.v
	if u := g.policies.UsageRoute(b2s(ctx.Method()), b2s(ctx.Path())); u != nil {
		if !g.resolveUsage(ctx, e, u) {
			return
		}
	} else {
		*req = g.policies.Resolve(fastRequest{ctx}, b2s(ctx.Method()), b2s(ctx.Path()))
	}
	req.Releases = true // (the end releases the slots)
	g.decider.DecideInto(dctx, req, v)
	if !v.Passes() {
		e.replyFast(ctx, v.Problem)
		g.fields(&ctx.Response.Header, v.Decisions)
		e.fire(endWhole)
		return
	}
	if v.Hold > 0 {
		// The hold moves the read deadline; the body (if any) gets its allowance again after.
		stayed := hold(ctx.Conn(), v.Hold)
		restartBody(ctx.Conn(), g.cfg.Server.BodyTimeout)
		if !stayed { // the client left while held: do not forward
			g.metrics.abandon(req.Client)
			ctx.SetConnectionClose()
			e.fire(endClientLeft)
			return
		}
	}
	if p, ok := e.admitShed(); !ok { // after the quotas: a refused request never takes a slot (shed.go)
		e.replyFast(ctx, p)
		g.fields(&ctx.Response.Header, v.Decisions)
		e.fire(endWhole)
		return
	}
	if span != nil {
		propagator.Inject(dctx, fastCarrier{&ctx.Request.Header}) // this span is the upstream's parent
	}
	how, later := g.forward(ctx, e)
	g.fields(&ctx.Response.Header, v.Decisions)
	if !later {
		e.fire(how)
	}
}

// fields adds the RateLimit fields of decisions to h.
func (g *Gateway) fields(h *fasthttp.ResponseHeader, decisions []answer.Applied) {
	if len(decisions) == 0 {
		return
	}
	var buf [256]byte
	policy, limit := answer.FieldValues(buf[:0], decisions)
	h.AddBytesV(answer.FieldRateLimitPolicy, policy)
	h.AddBytesV(answer.FieldRateLimit, limit)
	if g.cfg.Limits.LegacyHeaders {
		l, r, t := answer.LegacyValues(decisions)
		h.SetBytesV(answer.LegacyLimit, strconv.AppendInt(buf[:0], l, 10))
		h.SetBytesV(answer.LegacyRemaining, strconv.AppendInt(buf[:0], r, 10))
		h.SetBytesV(answer.LegacyReset, strconv.AppendInt(buf[:0], t, 10))
	}
}

// writeProblem is answer.WriteProblem for the fasthttp engine.
func writeProblem(ctx *fasthttp.RequestCtx, p answer.Problem) {
	resp := &ctx.Response
	resp.Reset()
	resp.SetStatusCode(p.Head(resp.Header.Set))
	b := bodyBuffers.Get().(*[]byte)
	*b = p.AppendJSON((*b)[:0])
	resp.AppendBody(*b) // a copy, into the response's own buffer
	bodyBuffers.Put(b)
}

var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

var http11 = []byte("HTTP/1.1")

// hopHeaders are the hop-by-hop fields (RFC 9110, section 7.6.1): they describe one connection
// and are not forwarded, in either direction. Transfer-Encoding and Content-Length are fasthttp's
// own: it frames each message itself.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Upgrade"}

// expect is the extra field removeHopHeaders drops from a request (a variable: a slice literal
// in the call would be allocated on every request).
var expect = []string{"Expect"}

// forward sends the request to the upstream and makes its answer the response. It reports how
// the request ended, or later: the response is the upstream's stream (or a tunnel), whose end
// fires the request's end.
func (g *Gateway) forward(ctx *fasthttp.RequestCtx, e *requestEnd) (how ending, later bool) {
	req, resp := &ctx.Request, &ctx.Response
	up := g.up
	e.sent.Store(true)
	if upgrade := req.Header.Peek("Upgrade"); len(upgrade) > 0 {
		return g.tunnel(ctx, e)
	}
	clientClose := req.Header.ConnectionClose()
	// Expect too: the listener has answered the client's "Expect: 100-continue" (the body is
	// coming), and the upstream is sent the body at once, so it must not be asked to say 100.
	removeHopHeaders(&req.Header, expect...)
	req.Header.ResetConnectionClose() // the upstream connection is kept alive, whatever the client's
	req.Header.SetProtocol("HTTP/1.1")
	g.forwardedFor(ctx)
	target(req, up)

	out, body := req, (*clientBody)(nil)
	// -2: neither a length nor chunked, which in a request is no body
	cl := req.Header.ContentLength()
	nothingToRead := !req.IsBodyStream() || cl == 0 || cl == -2
	if !nothingToRead {
		// The upstream is sent a request of its own whose body reads the client's through a
		// clientBody, so that a body the client never finishes, or malforms, is the client's
		// fault (400, 408), not the upstream's (502, 504). (The client's request keeps its stream:
		// the server drains what is left of it.)
		out = fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(out)
		req.Header.CopyTo(&out.Header)
		req.URI().CopyTo(out.URI())
		body = &clientBody{r: ctx.RequestBodyStream()}
		out.SetBodyStream(body, req.Header.ContentLength())
	} else if req.IsBodyStream() {
		// No body: nothing for the upstream to read (and a request without a stream may be
		// retried on a fresh connection: see retryUpstream).
		_ = req.CloseBodyStream()
	}
	// The client is watched while the request is in flight, if nothing of its request is left to
	// read: if it leaves, the upstream's call is cancelled (its connection closed: the upstream
	// sees its request cancelled), whether it waits for the header or streams the body, and the
	// request ends at once.
	call := &e.call
	call.hc = up.client
	var cw *clientWatch
	if nothingToRead {
		cw = e.watch.start(ctx.Conn())
	}
	upResp := fasthttp.AcquireResponse()
	sent := time.Now()
	err := call.do(out, upResp)
	took := time.Since(sent)
	if u := e.req.Usage; u != nil { // the upstream has the body (or never will): let it go
		u.Body = nil
		req.ResetBody()
		e.body.release()
	}
	if err != nil {
		cw.stop()
		fasthttp.ReleaseResponse(upResp)
		if call.cancelled() {
			ctx.SetConnectionClose() // the client left: no one to answer
			return endClientLeft, false
		}
		if berr := body.failed(); berr != nil {
			bc := bodyConnOf(ctx.Conn())
			e.replyFast(ctx, g.clientBodyFailed(ctx.RemoteAddr().String(), bc != nil && bc.timedOut, berr))
			ctx.SetConnectionClose() // the rest of the body, if any, cannot be found
			return endWhole, false
		}
		e.replyFast(ctx, g.upstreamFailed(err))
		return endNoResponse, false
	}
	g.metrics.upstreamAnswered(upResp.StatusCode(), took)
	e.answered(upResp.StatusCode(), took, func(name string) string { return b2s(upResp.Header.Peek(name)) })
	e.meter(b2s(upResp.Header.ContentType()), b2s(upResp.Header.ContentEncoding()))
	upResp.Header.CopyTo(&resp.Header)
	removeHopHeaders(&resp.Header)
	// The answer is this server's, in its own protocol: an HTTP/1.0 upstream's status line and
	// its "close" are about the upstream's connection.
	resp.Header.SetProtocol(http11)
	resp.Header.ResetConnectionClose()
	if clientClose {
		ctx.SetConnectionClose()
	}
	if !upResp.IsBodyStream() { // no body (HEAD, 204, 304): the response is whole
		cw.stop()
		resp.SkipBody = upResp.SkipBody
		fasthttp.ReleaseResponse(upResp)
		return endWhole, false
	}
	if n := call.inHand(upResp); n >= 0 {
		// A short answer of known length, all read already (most API answers): taken whole, the
		// connection given back and the request ended now, rather than streamed to the client
		// (which costs fasthttp's stream and its close, a tenth of a request's own CPU).
		cw.stop()
		b := slices.Grow(resp.SwapBody(nil)[:0], n)[:n]
		_, err := io.ReadFull(upResp.BodyStream(), b) // (from the buffer: no wait)
		resp.SwapBody(b)
		if e.usage != nil {
			e.usage.Write(b)
		}
		call.finish(upResp, err == nil)
		fasthttp.ReleaseResponse(upResp)
		if err != nil { // (cannot happen: the bytes are in the buffer)
			e.replyFast(ctx, g.upstreamFailed(err))
			return endNoResponse, false
		}
		return endWhole, false
	}
	e.stream = endStream{up: upResp, body: upResp.BodyStream(), call: call, e: e, watch: cw}
	resp.SetBodyStream(&e.stream, upResp.Header.ContentLength())
	return endWhole, true
}

// target points req at the upstream: its scheme and host (the HostClient refuses a request whose
// scheme is not its own: a client's https must not become the upstream's), and its path in front.
func target(req *fasthttp.Request, up *Upstream) {
	uri := req.URI()
	if up.path != "" {
		uri.SetPathBytes(append([]byte(up.path), uri.PathOriginal()...))
	}
	uri.SetScheme(up.scheme)
	uri.SetHost(up.host)
	req.Header.SetHost(up.host)
}

// forwardedFor appends the peer to X-Forwarded-For (every line the client sent, joined, then the
// peer) and sets X-Forwarded-Host and X-Forwarded-Proto, as httputil.ProxyRequest.SetXForwarded does.
func (g *Gateway) forwardedFor(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	var buf [128]byte
	b := buf[:0]
	for _, line := range h.PeekAll("X-Forwarded-For") {
		b = append(b, line...)
		b = append(b, ", "...)
	}
	if peer, ok := (fastRequest{ctx}).Peer(); ok {
		b = peer.AppendTo(b)
	} else if len(b) > 0 {
		b = b[:len(b)-2]
	}
	h.Del("X-Forwarded-For")
	if len(b) > 0 {
		h.SetBytesV("X-Forwarded-For", b)
	}
	h.SetBytesV("X-Forwarded-Host", h.Host())
	if ctx.IsTLS() {
		h.Set("X-Forwarded-Proto", "https")
	} else {
		h.Set("X-Forwarded-Proto", "http")
	}
}

// headerFields is what removeHopHeaders needs of a fasthttp request or response header.
type headerFields interface {
	PeekAll(string) [][]byte
	Del(string)
	Add(string, string)
	All() iter.Seq2[[]byte, []byte]
}

// removeHopHeaders deletes the hop-by-hop fields, those the Connection field names, and extra
// (Expect, say), keeping the order of the lines of every other field. Most messages have none of
// them: one pass over the fields finds out before anything is looked up by name.
func removeHopHeaders(h headerFields, extra ...string) {
	if !hasHopHeaders(h, extra) {
		return
	}
	names := append(slices.Clone(hopHeaders), extra...)
	for _, line := range h.PeekAll("Connection") {
		for _, tok := range strings.Split(string(line), ",") {
			if tok = strings.TrimSpace(tok); tok != "" && !oneOf(tok, []string{"close", "keep-alive"}) {
				names = append(names, tok)
			}
		}
	}
	// fasthttp deletes a field by swapping the last line into its place, which can reorder the
	// lines of a field sent on several (X-Forwarded-For, Via, ...), whose order is significant
	// (RFC 9110, section 5.3). Note those lines first, and put them back in order after.
	count := map[string]int{}
	for k := range h.All() {
		count[string(k)]++
	}
	kept := func(name string) bool { return count[name] > 1 && !oneOf(name, names) && !specialField(name) }
	var lines [][2]string
	for k, v := range h.All() {
		if kept(string(k)) {
			lines = append(lines, [2]string{string(k), string(v)})
		}
	}
	for _, name := range names {
		h.Del(name)
	}
	for name := range count {
		if kept(name) {
			h.Del(name)
		}
	}
	for _, l := range lines {
		h.Add(l[0], l[1])
	}
}

// hasHopHeaders reports whether h has a hop-by-hop field or one of extra. On the concrete types,
// ranging over the fields allocates nothing; through the interface it would, and a closure in
// this function (over extra, or the interface's loop) moved its result to the heap: two
// allocations on every request and every response.
func hasHopHeaders(h headerFields, extra []string) bool {
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		for k := range h.All() {
			if isHop(k, extra) {
				return true
			}
		}
		return false
	case *fasthttp.ResponseHeader:
		for k := range h.All() {
			if isHop(k, extra) {
				return true
			}
		}
		return false
	}
	return anyHop(h, extra)
}

// anyHop is hasHopHeaders on another implementation of headerFields.
func anyHop(h headerFields, extra []string) bool {
	for k := range h.All() {
		if isHop(k, extra) {
			return true
		}
	}
	return false
}

// isHop reports whether the field name k is a hop-by-hop field or one of extra.
func isHop(k []byte, extra []string) bool {
	return oneOf(b2s(k), hopHeaders) || oneOf(b2s(k), extra)
}

// oneOf reports whether name is one of names, ignoring case.
func oneOf(name string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// specialField reports the fields fasthttp keeps apart from the others (and frames or joins
// itself), which removeHopHeaders leaves where they are.
func specialField(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Type", "Content-Length", "User-Agent", "Cookie", "Set-Cookie", "Connection",
		"Transfer-Encoding", "Trailer", "Server", "Date":
		return true
	}
	return false
}

// upstreamFailed counts and logs a request the upstream did not answer and returns its answer:
// 504 if the upstream was too slow, else 502.
func (g *Gateway) upstreamFailed(err error) answer.Problem {
	g.metrics.upstreamErrors.Inc()
	timeout := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.Is(err, fasthttp.ErrDialTimeout) || isTimeout(err)
	what := "no answer: " + err.Error()
	if timeout {
		what = "no answer in time: " + err.Error()
	}
	g.upstreamTrouble(what)
	return answer.UpstreamUnavailable(timeout)
}

// upstreamTrouble logs, rate limited, what went wrong with the upstream. (The upstream's address
// is its host and port: the configuration's URL without a user or a password.)
func (g *Gateway) upstreamTrouble(what string) {
	host := ""
	if g.up != nil {
		host = g.up.host
	}
	g.metrics.upstreamLog.warn(host, what)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// tunnel forwards a protocol upgrade (a WebSocket, say): the request goes to the upstream on a
// connection of its own, and once the upstream answers, bytes are copied both ways until either
// side closes. The answer is the upstream's, whatever it is (101 or a refusal): its status is
// read from its first line. The request is in flight, and ends (requestEnd), when the tunnel
// has closed both ways.
func (g *Gateway) tunnel(ctx *fasthttp.RequestCtx, e *requestEnd) (how ending, later bool) {
	up := g.up
	req := &ctx.Request
	g.forwardedFor(ctx)
	target(req, up)
	conn, err := up.dial()
	if err != nil {
		e.replyFast(ctx, g.upstreamFailed(err))
		return endNoResponse, false
	}
	w := bufio.NewWriter(conn)
	sent := time.Now()
	if err = req.Write(w); err == nil {
		err = w.Flush()
	}
	if err != nil {
		conn.Close()
		e.replyFast(ctx, g.upstreamFailed(err))
		return endNoResponse, false
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(client net.Conn) {
		defer conn.Close()
		br := bufio.NewReader(conn)
		_ = conn.SetReadDeadline(time.Now().Add(upstreamIdle))
		status, ok := statusOf(br)
		_ = conn.SetReadDeadline(time.Time{}) // a tunnel may be silent as long as its ends like
		if !ok {                              // no answer: the client's connection is closed without one
			g.upstreamFailed(io.ErrUnexpectedEOF)
			e.fire(endNoResponse)
			return
		}
		took := time.Since(sent)
		g.metrics.upstreamAnswered(status, took)
		e.answered(status, took, nil)
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(conn, client); closeWrite(conn); done <- struct{}{} }()
		go func() { _, _ = io.Copy(client, br); closeWrite(client); done <- struct{}{} }()
		<-done
		<-done
		e.fire(endWhole)
	})
	return endWhole, true
}

// statusOf peeks the status of the response br starts with ("HTTP/1.1 101 ..."): false if the
// upstream closed, or sent something else, before it.
func statusOf(br *bufio.Reader) (int, bool) {
	line, err := br.Peek(len("HTTP/1.1 101"))
	if err != nil || !bytes.HasPrefix(line, []byte("HTTP/")) || line[8] != ' ' {
		return 0, false
	}
	status, err := strconv.Atoi(string(line[9:12]))
	return status, err == nil && status >= 100 && status <= 999
}

// closeWrite half-closes c if it can, so the other side sees the end of what this side sent.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// fastRequest is what identity reads of a fasthttp request. Its strings point into the request's
// buffers: identity sources do not keep them (see identity.Source).
type fastRequest struct{ ctx *fasthttp.RequestCtx }

func (r fastRequest) Header(name string) string { return b2s(r.ctx.Request.Header.Peek(name)) }

func (r fastRequest) HeaderValues(name string) []string {
	lines := r.ctx.Request.Header.PeekAll(name)
	if len(lines) == 0 {
		return nil
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = b2s(l)
	}
	return out
}

func (r fastRequest) Peer() (netip.Addr, bool) {
	if a, ok := r.ctx.RemoteAddr().(*net.TCPAddr); ok {
		addr := a.AddrPort().Addr()
		return addr.WithZone("").Unmap(), addr.IsValid()
	}
	return netip.Addr{}, false
}

func (r fastRequest) Query(name string) string {
	return identity.QueryValue(b2s(r.ctx.URI().QueryString()), name)
}

// b2s is a string over b, without a copy: for reading only, while b does not change.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// hold waits d and reports whether the client is still there: false as soon as the client closes
// its connection (see watchClose).
func hold(conn net.Conn, d time.Duration) bool {
	deadline := time.Now().Add(d)
	if !watchClose(conn, deadline) {
		return false
	}
	if wait := time.Until(deadline); wait > 0 {
		time.Sleep(wait) // watchClose could not watch (it says so by returning early): wait the rest
	}
	return true
}
