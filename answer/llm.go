package answer

import (
	"net/http"
	"strconv"
)

// Shape is the body an answer of sluice's own is written in. A route in front of an LLM API can
// answer in its upstream's error shape, so that the provider's own client library (OpenAI's,
// Anthropic's) raises its own error class for a refusal, and waits the time it is told to.
type Shape uint8

const (
	ShapeProblem   Shape = iota // application/problem+json (RFC 9457): every answer's default
	ShapeOpenAI                 // {"error": {"message", "type", "param", "code"}}, as OpenAI's API answers
	ShapeAnthropic              // {"type": "error", "error": {"type", "message"}}, as Anthropic's API answers
)

var shapeNames = [...]string{ShapeProblem: "problem", ShapeOpenAI: "openai", ShapeAnthropic: "anthropic"}

func (s Shape) String() string {
	if int(s) < len(shapeNames) {
		return shapeNames[s]
	}
	return "Shape(" + strconv.Itoa(int(s)) + ")"
}

// ParseShape parses "problem", "openai" or "anthropic".
func ParseShape(s string) (Shape, bool) {
	for i, n := range shapeNames {
		if n == s {
			return Shape(i), true
		}
	}
	return 0, false
}

// FieldRetryAfterMs is the wait in milliseconds, beside Retry-After's seconds: OpenAI's and
// Anthropic's client libraries read it first, and a wait of 1.2 s is not rounded up to 2.
const FieldRetryAfterMs = "Retry-After-Ms"

// llmErrorType is the error's type in the shape of s for a problem of status.
func llmErrorType(s Shape, status int) string {
	if s == ShapeOpenAI {
		switch status {
		case http.StatusTooManyRequests:
			return "rate_limit_exceeded"
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return "invalid_request_error"
		}
		return "server_error"
	}
	switch status { // Anthropic's (docs.anthropic.com: errors)
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return "overloaded_error"
	}
	return "api_error"
}

// appendLLM appends p in the error shape of an LLM API (p.Shape is ShapeOpenAI or
// ShapeAnthropic): the message is the problem's detail (else its title), and the problem's own
// members follow in the error object under sluice's names, which the client libraries ignore.
func (p Problem) appendLLM(b []byte) []byte {
	msg := p.Detail
	if msg == "" {
		msg = p.Title
	}
	typ := llmErrorType(p.Shape, p.Status)
	if p.Shape == ShapeAnthropic {
		b = append(b, `{"type":"error","error":{"type":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, msg)
	} else {
		b = append(b, `{"error":{"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"param":null,"code":`...)
		b = appendJSONString(b, typ)
	}
	if p.ViolatedPolicies != nil {
		b = append(b, `,"violated_policies":`...)
		b = appendJSONStrings(b, p.ViolatedPolicies)
	}
	if p.RetryAfter > 0 {
		b = append(b, `,"retry_after":`...)
		b = strconv.AppendInt(b, p.RetryAfter, 10)
	}
	return append(b, "}}"...)
}
