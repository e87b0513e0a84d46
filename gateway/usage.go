package gateway

import (
	"bytes"
	"errors"
	"io"
	"slices"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
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

// bodySlack is the room a usage route's body is read with past its end, for the edit that adds
// stream_options.include_usage (the route's inject_usage) in place rather than in a copy.
const bodySlack = 64

// bodyReserve is the body memory a usage route's body of length (-1: chunked, unknown) reserves
// before it is read, when at most max bytes of it are read: 0 for one known to be too large (it
// is not read), its length for one that says it, max for one that does not (the rest is given
// back once it is read), each with bodySlack.
func bodyReserve(length, max int64) int64 {
	switch {
	case length > max:
		return 0
	case length >= 0:
		return length + bodySlack
	}
	return max + 1 + bodySlack
}

// readUsageBody reads a usage route's request body from r, whose length is length (-1: chunked,
// unknown), at most max bytes: a longer one is decision.ErrBodyTooLarge. It is read into one
// array of its own size (with bodySlack), which is the copy the estimate reads in place and the
// upstream is sent. The rest of a body up to twice max is read and thrown away, so that the
// client, still sending, gets its 413 rather than a reset connection; drained reports that the
// whole body was read (the connection can serve the next request).
func readUsageBody(r io.Reader, length int64, max int64) (body []byte, drained bool, err error) {
	if length > max {
		if length > 2*max {
			return nil, false, decision.ErrBodyTooLarge
		}
		n, err := io.Copy(io.Discard, io.LimitReader(r, length))
		return nil, err == nil && n == length, decision.ErrBodyTooLarge
	}
	size := length
	if size < 0 {
		size = min(max+1, 4<<10)
	}
	buf := make([]byte, 0, size+bodySlack)
	for {
		if len(buf) == cap(buf)-bodySlack { // (chunked: grow, at most to max+1)
			grown := make([]byte, len(buf), min(2*int64(len(buf)), max+1)+bodySlack)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf) : cap(buf)-bodySlack])
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

// usageBody is a usage route's request body as a front end has it.
type usageBody struct {
	stream io.Reader // the body still to read from the client; nil: in hand (the fasthttp engine read it already)
	inHand []byte    // the body when stream is nil
	length int64     // its Content-Length; -1: chunked, unknown
	peer   string    // the client's address, for the log of a body that fails
	// timedOut reports whether reading the body ran out of its allowance (server.body_timeout);
	// nil: the error says so.
	timedOut func() bool
}

// resolveUsageBody is the one reading of a usage route's body, both engines': it reserves the
// body's memory (bodymem.go), reads the body once, and resolves the request into e.req
// (decision.Policies.ResolveUsage: the estimate read in place, the usage injected in place). ok
// false: the answer to send (a body too large, unreadable, not a request it can estimate, or no
// room for it: in the route's shape) and whether the body was read to its end.
func (g *Gateway) resolveUsageBody(e *requestEnd, r identity.Request, method, path string, u *config.Usage, src usageBody) (prob answer.Problem, drained, ok bool) {
	body, drained, err := src.inHand, true, error(nil)
	if src.stream != nil {
		if n := bodyReserve(src.length, u.MaxBody); n > 0 {
			n, ok := g.metrics.bodies.acquire(n, g.cfg.Server.BodyTimeout)
			if !ok {
				return answer.BodyMemoryFull(u.Errors, bodyMemoryRetry), false, false
			}
			e.body.hold(g.metrics.bodies, n)
		}
		body, drained, err = readUsageBody(src.stream, src.length, u.MaxBody)
		if err != nil {
			e.body.release()
		} else {
			e.body.shrink(int64(len(body)) + bodySlack) // (chunked: what it did not need)
		}
	} else if int64(len(body)) > u.MaxBody {
		err = decision.ErrBodyTooLarge
	}
	req, ok, prob := g.policies.ResolveUsage(r, method, path, body, err)
	if !ok {
		var re errBodyRead
		if errors.As(err, &re) {
			timedOut := src.timedOut != nil && src.timedOut()
			prob = g.clientBodyFailed(src.peer, timedOut, re.err)
			prob.Shape = u.Errors
		}
		return prob, drained, false
	}
	e.req = req
	return answer.Problem{}, true, true
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
// into e.req, the body to forward set on the request without a copy; false: it answered the
// request itself, and fired its end.
func (g *Gateway) resolveUsage(ctx *fasthttp.RequestCtx, e *requestEnd, u *config.Usage) bool {
	src := usageBody{length: int64(ctx.Request.Header.ContentLength()), peer: ctx.RemoteAddr().String()}
	if ctx.Request.IsBodyStream() {
		src.stream = ctx.RequestBodyStream()
		src.timedOut = func() bool { bc := bodyConnOf(ctx.Conn()); return bc != nil && bc.timedOut }
	} else {
		// fasthttp's own buffer (a body that came whole with its header), clipped so that an
		// edit that makes it longer is made in a new array, not past its end.
		src.inHand = slices.Clip(ctx.Request.Body())
	}
	prob, drained, ok := g.resolveUsageBody(e, fastRequest{ctx}, b2s(ctx.Method()), b2s(ctx.Path()), u, src)
	if !ok {
		e.replyFast(ctx, prob)
		if !drained {
			ctx.SetConnectionClose() // the rest of the body is not read
		}
		e.fire(endWhole)
		return false
	}
	switch body := e.req.Usage.Body; {
	case src.stream != nil, len(body) > 0 && len(src.inHand) > 0 && &body[0] != &src.inHand[0]:
		ctx.Request.SetBodyRaw(body) // the one copy, ours, not copied again (the stream read is over)
	case len(body) != len(src.inHand):
		// Edited shorter in fasthttp's buffer, which SetBodyRaw gives back to its pool: a copy.
		ctx.Request.SetBodyRaw(bytes.Clone(body))
	}
	usageHeader(ctx.Request.Header.Set)
	return true
}
