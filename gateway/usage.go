package gateway

import (
	"errors"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/llm"
)

// USAGE ROUTES (decision/usage.go). Both proxy engines do the same four things for a request on a
// route with usage, each in one place here:
//
//   - its body is read whole before it is decided (readUsageBody), at most the route's max_body
//     (a longer one is answered 413 without reading the rest), within the body's allowance
//     (server.body_timeout), and decision.Policies.ResolveUsage estimates it;
//   - it is forwarded with that body (with stream_options.include_usage added if the route
//     injects it), and asks for an uncompressed response (usageHeader): the usage is read from
//     the response's bytes as they pass, which a gzip body would hide;
//   - the response's body is fed to an llm.Meter as it is copied to the client (meter), whatever
//     its length, without holding any of it;
//   - when the request ends (requestEnd.fire), decision.Finish settles every limit to the usage
//     the meter read, or keeps the estimate if it read none.

// errBodyRead wraps the error of reading a usage route's body from the client.
type errBodyRead struct{ err error }

func (e errBodyRead) Error() string { return "reading the request body: " + e.err.Error() }
func (e errBodyRead) Unwrap() error { return e.err }

// readUsageBody reads a usage route's request body from r, whose length is length (-1: chunked,
// unknown), at most max bytes: a longer one is decision.ErrBodyTooLarge. The rest of a body up
// to twice max is read and thrown away, so that the client, still sending, gets its 413 rather
// than a reset connection; drained reports that the whole body was read (the connection can
// serve the next request).
func readUsageBody(r io.Reader, length int64, max int64) (body []byte, drained bool, err error) {
	if length > 2*max {
		return nil, false, decision.ErrBodyTooLarge
	}
	size := length
	if size < 0 || size > max {
		size = min(max, 4<<10)
	}
	buf := make([]byte, 0, size+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > max {
			rest, err := io.Copy(io.Discard, io.LimitReader(r, max+1))
			return nil, err == nil && rest <= max, decision.ErrBodyTooLarge
		}
		if err == io.EOF {
			return buf, true, nil
		}
		if err != nil {
			return nil, false, errBodyRead{err}
		}
	}
}

// usageProblem is the answer to a usage route's request whose body could not be read or
// estimated: the client's body failing to arrive is clientBodyFailed's (400, 408), in the route's
// shape.
func (g *Gateway) usageProblem(prob answer.Problem, err error, peer string, timedOut bool) answer.Problem {
	var re errBodyRead
	if errors.As(err, &re) {
		shape := prob.Shape
		prob = g.clientBodyFailed(peer, timedOut, re.err)
		prob.Shape = shape
	}
	return prob
}

// meter starts reading the usage of a usage route's response whose Content-Type is contentType
// and Content-Encoding encoding: nil for any other request, or a body it cannot read (encoded:
// its usage is not found, and the estimate stands).
func (e *requestEnd) meter(contentType, encoding string) {
	u := e.req.Usage
	if u == nil || (encoding != "" && encoding != "identity") {
		return
	}
	e.usage = llm.NewMeter(u.Rule.Format, u.Rule.Field, contentType)
}

// usageOf is the usage the response's body reported, for Finish (nil: not metered).
func (e *requestEnd) usageOf() *llm.Usage {
	if e.usage == nil {
		return nil
	}
	u := e.usage.Usage()
	return &u
}

// usageHeader sets what a usage route's request asks of the upstream: an uncompressed answer.
func usageHeader(set func(name, value string)) { set("Accept-Encoding", "identity") }

// resolveUsage reads the body of a request on a usage route (fasthttp engine) and resolves it
// into e.req, the body to forward set on the request; false: it answered the request itself (a
// body too large, unreadable, or not a request it can estimate), and fired its end.
func (g *Gateway) resolveUsage(ctx *fasthttp.RequestCtx, e *requestEnd, max int64) bool {
	var body []byte
	var err error
	drained := true
	if ctx.Request.IsBodyStream() {
		body, drained, err = readUsageBody(ctx.RequestBodyStream(), int64(ctx.Request.Header.ContentLength()), max)
	} else if body = ctx.Request.Body(); int64(len(body)) > max {
		err = decision.ErrBodyTooLarge
	}
	req, ok, prob := g.policies.ResolveUsage(fastRequest{ctx}, b2s(ctx.Method()), b2s(ctx.Path()), body, err)
	if !ok {
		bc := bodyConnOf(ctx.Conn())
		prob = g.usageProblem(prob, err, ctx.RemoteAddr().String(), bc != nil && bc.timedOut)
		writeProblem(ctx, prob)
		if !drained {
			ctx.SetConnectionClose() // the rest of the body is not read
		}
		e.answeredBy(ctx.Response.StatusCode())
		e.fire(endWhole)
		return false
	}
	e.req = req
	ctx.Request.SetBody(req.Usage.Body) // (a copy: the stream read is the server's)
	usageHeader(ctx.Request.Header.Set)
	return true
}
