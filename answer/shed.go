package answer

import (
	"fmt"
	"net/http"
	"time"
)

// TypeTemporaryReducedCapacity: the request was not forwarded because the upstream is struggling
// and the gateway sheds load (503). The client did nothing wrong: it is not a quota refusal.
const TypeTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

// ReducedCapacity is the 503 problem for a request the quotas let through but load shedding did
// not forward: the upstream answers slower than its baseline, and the requests in flight are at
// what the request's priority may fill. retryAfter is rounded up to whole seconds, at least 1.
func ReducedCapacity(client string, retryAfter time.Duration) Problem {
	p := Problem{
		Type:       TypeTemporaryReducedCapacity,
		Title:      "Temporary Reduced Capacity",
		Status:     http.StatusServiceUnavailable,
		Client:     client,
		RetryAfter: max(1, Seconds(retryAfter)),
	}
	p.Detail = fmt.Sprintf("the API is slower than usual and this gateway limits the requests in flight to it; the request from %s was not forwarded (not a quota refusal: the client did nothing wrong); retry after %d s",
		who(client), p.RetryAfter)
	return p
}

// BodyMemoryFull is the answer to a request on a usage route whose body did not fit in time in
// the memory the gateway gives request bodies read for their estimate (server.body_memory): 503
// with Retry-After (retryAfter, whole seconds, at least 1), in the route's shape; nothing was
// read or charged.
func BodyMemoryFull(shape Shape, retryAfter time.Duration) Problem {
	p := Problem{
		Type:       TypeTemporaryReducedCapacity,
		Title:      "Temporary Reduced Capacity",
		Status:     http.StatusServiceUnavailable,
		RetryAfter: max(1, Seconds(retryAfter)),
		Shape:      shape,
	}
	p.Detail = fmt.Sprintf("this gateway is reading as many request bodies as it holds at once (server.body_memory); the request was not read, forwarded or charged; retry after %d s", p.RetryAfter)
	return p
}
