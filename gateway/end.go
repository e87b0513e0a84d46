package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/llm"
)

// THE END OF A REQUEST. A request's life ends when the last byte of its response has been
// written to the client, or the client or the upstream went away: not when the upstream's header
// arrived. Each front end makes one requestEnd per request (begin) and fires it exactly once
// (requestEnd.fire) when it sees that end, with what happened (an ending); everything tied to the
// end subscribes to it there, in one place:
//
//   - concurrency slots: decision.Decider.ReleaseSlots;
//   - load shedding: the in-flight slot is given back, the upstream's time to its header is the
//     latency sample (shedder.release);
//   - settlements (cost_from, count_only, refund_on, a usage route's usage): decision.Decider.Finish;
//   - metrics: a response the upstream cut short counts in sluice_upstream_errors_total (and is
//     logged, rate limited);
//   - the access log line (its latency is the whole request's, to the end) and the span.
//
// Where each front end fires it:
//
//   - the fasthttp engine (ServeFast): the upstream's body is streamed (StreamResponseBody), so
//     the end is when fasthttp has copied the stream to the client: the response's body stream is
//     an endStream, which fires when fasthttp closes it (at the stream's end, on an error either
//     side, or when the response is released), or when the client is seen to leave (clientWatch);
//     a tunnel (an upgrade) fires when both directions have closed; a response without a stream
//     (refused, failed, HEAD, 204, 304), or whose whole body the upstream had already sent when
//     its header was read (a short answer of known length, upstreamCall.inHand: nothing is left
//     to wait for), fires before the handler returns, as fasthttp is about to write it.
//   - the net/http engine (ServeHTTP): httputil.ReverseProxy returns once it has copied the body
//     (or the tunnel closed, or the client left: the request's context is cancelled, which cancels
//     the upstream's request); the handler fires then, what the body stream saw (endBody) telling a
//     response cut short from a whole one.
//   - package middleware, forward-auth and POST /v1/check do not see the response end (the first
//     two do not take slots to release, see decision/slots.go; none settles after a response).

// ending is how a request ended.
type ending uint8

const (
	endWhole      ending = iota // the response was written whole (whoever wrote it: the upstream or sluice)
	endNoResponse               // the upstream gave no response (sluice answered 502 or 504)
	endCut                      // the upstream's response was cut short: the client saw it fail
	endClientLeft               // the client left before its response was written whole
)

// requestEnd is one request's end: what the subscribers need, and what happened.
type requestEnd struct {
	g     *Gateway
	ctx   context.Context // the store calls' (never the client's: the end outlives it)
	req   decision.Request
	v     decision.Verdict
	kept  *decision.Verdict // net/http: the decisions settlement needs (decision.Serve releases v); nil: v
	start time.Time         // zero without an access log
	span  trace.Span
	shed  bool     // holds a load-shedding slot
	body  heldBody // a usage route's body's memory (bodymem.go), until the upstream has it

	method, path string // for the access log (copies: the fasthttp engine reuses its buffers)

	// What happened, set by the front end before it fires (or by the goroutine that fires).
	mu       sync.Mutex
	status   int                 // the status the client was sent (0: none)
	header   func(string) string // the upstream's cost_from field, for settlement (nil: none)
	upstream time.Duration       // the upstream's time to its header (0: it did not answer)

	// usage reads a usage route's response's usage from its body as it passes (usage.go); nil:
	// none. It is written by whoever copies the body, which also fires the end.
	usage *llm.Meter

	sent  atomic.Bool // the request was sent to the upstream (or the sending began)
	cut   atomic.Bool // net/http: the upstream's body failed (endBody)
	w     endWriter   // net/http: the response writer (gateway.go)
	fired atomic.Bool
	// refs: the handler and the end each hold the Verdict's memory; the last to let go releases
	// it (the fasthttp engine's end can come before its handler returns, if the client leaves).
	refs atomic.Int32

	// The fasthttp engine's: its call to the upstream, the watch of its client and its response's
	// stream live in the end's memory, which is reused (endPool) once both holders let go.
	call   upstreamCall
	watch  clientWatch
	stream endStream
	pooled bool
}

// endPool keeps the fasthttp engine's ends for reuse: a request then allocates none of them, nor
// its watch's timer.
var endPool = sync.Pool{New: func() any {
	e := new(requestEnd)
	e.watch.left = e.call.cancel
	return e
}}

// begin makes the end of a request arriving now; pooled (the fasthttp engine's) takes it from
// endPool, and gives it back when both the handler and the end let go (drop).
func (g *Gateway) begin(ctx context.Context, span trace.Span, method, path string, pooled bool) *requestEnd {
	if ctx.Done() != nil { // (the fasthttp engine's never ends: no need for a copy per request)
		ctx = context.WithoutCancel(ctx)
	}
	var e *requestEnd
	if pooled {
		e = endPool.Get().(*requestEnd)
		e.g, e.ctx, e.span, e.pooled = g, ctx, span, true
	} else {
		e = &requestEnd{g: g, ctx: ctx, span: span}
	}
	e.refs.Store(2)
	if g.access != nil {
		e.start, e.method, e.path = time.Now(), method, path
	}
	return e
}

// answered notes the upstream's answer: its status, its time to its header, and its header
// fields (field), of which settlement's cost_from field is kept (a copy: the response's memory
// is not the end's).
func (e *requestEnd) answered(status int, took time.Duration, field func(string) string) {
	var h func(string) string
	if a := e.req.After; a != nil && a.CostFrom != "" && field != nil {
		name, value := a.CostFrom, strings.Clone(field(a.CostFrom))
		h = func(n string) string {
			if strings.EqualFold(n, name) {
				return value
			}
			return ""
		}
	}
	e.mu.Lock()
	e.status, e.upstream, e.header = status, max(took, time.Nanosecond), h
	e.mu.Unlock()
}

// answeredBy notes the status of an answer sluice gave itself.
func (e *requestEnd) answeredBy(status int) {
	e.mu.Lock()
	e.status = status
	e.mu.Unlock()
}

// fire delivers the end of the request to every subscriber, once: later calls do nothing.
func (e *requestEnd) fire(how ending) {
	if e.fired.Swap(true) {
		return
	}
	g := e.g
	e.mu.Lock()
	status, header, upstream := e.status, e.header, e.upstream
	e.mu.Unlock()
	g.decider.ReleaseSlots(e.ctx, &e.v) // concurrency slots
	e.body.release()                    // body memory, if the upstream's call did not give it back
	if e.shed {
		g.shed.release(upstream) // load shedding: the slot, and the latency sample
	}
	if how == endCut { // metrics: a response cut short is the upstream's failure
		g.metrics.upstreamErrors.Inc()
		g.upstreamTrouble("its response was cut short")
	}
	// Settlement. The upstream answered if its header came and its response was not cut short: a
	// client that leaves after the header is charged as answered (leaving does not make a
	// response free); one that leaves before it, or a response cut short, is a request without a
	// response (decision.Finish: refund_on refunds it, count_only charges nothing, cost_from
	// keeps the estimate).
	left := how == endClientLeft
	resp := decision.Response{Status: status, Header: header, Usage: e.usageOf(), Left: left}
	if upstream == 0 || how == endCut || how == endNoResponse {
		resp = decision.Response{Aborted: true, Left: left, Unsent: !e.sent.Load()}
	}
	g.decider.Finish(e.ctx, &e.req, e.verdict(), resp) // (nothing if it was settled already: refunded when shed)
	if how == endClientLeft && upstream == 0 {
		status = 499 // nginx's code for a client gone before its answer
	}
	// The access line and the span.
	if g.access != nil {
		g.access.write(&entry{start: e.start, req: &e.req, outcome: e.v.Outcome, method: e.method, path: e.path,
			status: status, upstream: upstream, ended: how})
	}
	if e.span != nil {
		endSpan(e.span, &e.req, e.v.Outcome, status)
	}
	e.drop()
}

// verdict is the Verdict settlement reads: the kept copy of the net/http engine's, else e.v.
func (e *requestEnd) verdict() *decision.Verdict {
	if e.kept != nil {
		return e.kept
	}
	return &e.v
}

// ANSWERS OF SLUICE'S OWN. Whatever sluice answers itself on a request — a refusal, a shed
// request, a body it could not read, an upstream that did not answer — is written through one of
// these two, which give it the shape of the request's answers (a usage route's errors: OpenAI's
// or Anthropic's, else a problem) and note the status the client was sent, for the access log,
// the span and settlement. (The net/http engine's endWriter notes the status as it is written.)

// shaped is p in the shape of the request's answers, unless it has one of its own.
func (e *requestEnd) shaped(p answer.Problem) answer.Problem {
	if p.Shape == answer.ShapeProblem {
		p.Shape = e.req.Shape()
	}
	return p
}

// replyFast writes p as the fasthttp engine's answer and notes its status.
func (e *requestEnd) replyFast(ctx *fasthttp.RequestCtx, p answer.Problem) {
	writeProblem(ctx, e.shaped(p))
	e.answeredBy(ctx.Response.StatusCode())
}

// replyHTTP writes p as the net/http engine's answer (w is the request's endWriter, or one over it).
func (e *requestEnd) replyHTTP(w http.ResponseWriter, p answer.Problem) {
	answer.WriteProblem(w, e.shaped(p))
}

// drop lets go of the Verdict's memory, for the handler or the end; the last one releases it.
func (e *requestEnd) drop() {
	if e.refs.Add(-1) != 0 {
		return
	}
	e.v.Release()
	if e.pooled {
		e.reuse()
	}
}

// reuse clears a pooled end and puts it back in endPool. Nothing refers to it any more: the
// handler and the end have let go, the watch has stopped (its timer's function has returned, if
// it ran), and fasthttp has closed the stream (which it then forgets).
func (e *requestEnd) reuse() {
	timer, done, left := e.watch.timer, e.watch.done, e.watch.left
	*e = requestEnd{}
	e.watch.timer, e.watch.done, e.watch.left = timer, done, left
	endPool.Put(e)
}

// endStream is the fasthttp engine's response body when the upstream's is a stream: it passes
// the upstream's body through unbuffered (fasthttp copies it to the client in chunks of its own
// buffer's size) and fires the request's end when fasthttp closes it: after the last byte was
// written (the upstream's stream ended and the copy succeeded), when a read or a write failed, or
// when the response is released. A read that fails while the client is there is a response cut
// short: fasthttp then ends the client's connection without the body's end (a short body, or a
// chunked one without its last chunk), so the client sees it fail.
type endStream struct {
	up    *fasthttp.Response // the upstream's response, whose stream this reads; released at the end
	body  io.Reader
	call  *upstreamCall
	e     *requestEnd
	watch *clientWatch // nil: the client is not watched

	// (fasthttp reads and closes the stream on one goroutine)
	eof     bool  // the upstream's body was read to its end
	readErr error // the upstream's stream failed (not io.EOF)
}

func (s *endStream) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if s.e.usage != nil && n > 0 {
		s.e.usage.Write(p[:n])
	}
	switch {
	case err == io.EOF:
		s.eof = true
	case err != nil && s.readErr == nil:
		s.readErr = err
	}
	return n, err
}

// CloseWithError is fasthttp's close of the stream (fasthttp.ReadCloserWithError): werr is why
// writing stopped (nil: it did not). It gives the upstream's connection back (closed unless the
// body was read to its end) and fires the request's end.
func (s *endStream) CloseWithError(werr error) error {
	s.watch.stop()
	how := endWhole
	switch {
	case s.call.cancelled():
		how = endClientLeft // (the watch closed the upstream's connection)
	case s.readErr != nil:
		how = endCut
	case werr != nil || !s.eof:
		how = endClientLeft // writing to the client failed: it left
	}
	s.call.finish(s.up, s.eof && werr == nil)
	fasthttp.ReleaseResponse(s.up)
	s.e.fire(how)
	return nil
}

// clientWatch watches a fasthttp client's connection, while its request is in flight, for the
// client to close it (watchClose), and calls left if it does. stop ends the watch and waits for
// it, giving the connection back to the server (which sets its own read deadline before it reads
// the next request). A nil clientWatch watches nothing.
//
// The watch starts only once the request has been in flight for watchDelay: most requests end
// sooner, and a watch costs a goroutine and moves the connection's deadline twice. A client that
// leaves is then seen at most watchDelay late. A clientWatch is part of a pooled requestEnd: its
// timer is made once and reset for each request it watches.
type clientWatch struct {
	conn  net.Conn
	left  func()
	timer *time.Timer   // starts the watch (fire)
	done  chan struct{} // (one slot) fire sends when it returns, whether it watched or not

	mu      sync.Mutex
	started bool // guarded by mu: the watching goroutine runs
	stopped bool // guarded by mu: no deadline may be set any more
}

// watchDelay is how long a request is in flight before its client is watched.
var watchDelay = 20 * time.Millisecond

// start watches conn from watchDelay on; left runs on the watching goroutine if the client
// leaves. The watch's previous use, if any, has stopped.
func (w *clientWatch) start(conn net.Conn) *clientWatch {
	w.mu.Lock()
	w.conn, w.started, w.stopped = conn, false, false
	w.mu.Unlock()
	if w.timer == nil {
		w.done = make(chan struct{}, 1)
		w.timer = time.AfterFunc(watchDelay, w.fire)
	} else {
		w.timer.Reset(watchDelay)
	}
	return w
}

// fire is the timer's function (its own goroutine, which the watch then is).
func (w *clientWatch) fire() {
	defer func() { w.done <- struct{}{} }()
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.started = true
	w.mu.Unlock()
	w.watch()
}

// watch waits for the client to leave, until the watch is stopped.
func (w *clientWatch) watch() {
	for {
		var deadline time.Time
		arm := func(socket net.Conn) bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			deadline = time.Now().Add(watchSpan)
			return !w.stopped && socket.SetReadDeadline(deadline) == nil
		}
		if !watchCloseArmed(w.conn, arm) {
			w.mu.Lock()
			stopped := w.stopped
			w.mu.Unlock()
			if !stopped {
				w.left()
			}
			return
		}
		// Back early: stopped, or the client sent more (a pipelined request), or the
		// connection cannot be watched: nothing more can be told from here.
		if deadline.IsZero() || time.Now().Before(deadline) {
			return
		}
	}
}

// watchSpan is how long one watchClose waits before it looks again (a stream can last hours).
const watchSpan = time.Hour

func (w *clientWatch) stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	started := w.started
	if started {
		_ = socketOf(w.conn).SetReadDeadline(time.Now()) // wakes the watch
	}
	w.mu.Unlock()
	if !started && w.timer.Stop() {
		return // it never fired
	}
	<-w.done // it fired: its function watched, or found the watch stopped; either way it has returned
}
