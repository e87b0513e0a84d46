package peertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Code is a rate limit answer: OK or OverLimit (Unknown is the zero value no answer has).
type Code = rlspb.RateLimitResponse_Code

// The answers.
const (
	Unknown   = rlspb.RateLimitResponse_UNKNOWN
	OK        = rlspb.RateLimitResponse_OK
	OverLimit = rlspb.RateLimitResponse_OVER_LIMIT
)

// Unit is a limit's window, as the response spells it (WEEK is 7, after YEAR).
type Unit = rlspb.RateLimitResponse_RateLimit_Unit

// The units.
const (
	Second = rlspb.RateLimitResponse_RateLimit_SECOND
	Minute = rlspb.RateLimitResponse_RateLimit_MINUTE
	Hour   = rlspb.RateLimitResponse_RateLimit_HOUR
	Day    = rlspb.RateLimitResponse_RateLimit_DAY
	Week   = rlspb.RateLimitResponse_RateLimit_WEEK
	Month  = rlspb.RateLimitResponse_RateLimit_MONTH
	Year   = rlspb.RateLimitResponse_RateLimit_YEAR
)

// UnitSeconds is each unit's fixed window in seconds, as the peer counts them: windows start at
// multiples of it from the Unix epoch (so a week starts on a Thursday, 00:00 UTC), a month is 30
// days and a year 365.
var UnitSeconds = map[Unit]int64{
	Second: 1, Minute: 60, Hour: 3600, Day: 86400, Week: 7 * 86400, Month: 30 * 86400, Year: 365 * 86400,
}

// Entry is one key/value pair of a descriptor.
type Entry struct{ Key, Value string }

// E is an Entry.
func E(key, value string) Entry { return Entry{key, value} }

// Limit is a rate limit: RequestsPerUnit per Unit. In a request it is a descriptor's override
// (Envoy's per-route limit, Name unused); in an answer it is the current_limit, and Name the
// rule's rate_limit.name ("" when the rule has none, and for an override).
type Limit struct {
	RequestsPerUnit uint32
	Unit            Unit
	Name            string
}

func (l *Limit) String() string {
	if l == nil {
		return "none"
	}
	s := fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
	if l.Name != "" {
		s += fmt.Sprintf(" (name %q)", l.Name)
	}
	return s
}

// Descriptor is one descriptor of a request.
type Descriptor struct {
	Entries []Entry
	// Limit, when set, is the request's own limit for this descriptor (the override).
	Limit *Limit
	// HitsAddend, when set, is this descriptor's hits_addend (0 is allowed: check without
	// counting); nil takes the request's.
	HitsAddend *uint64
}

// D is a Descriptor of entries, without an override or hits_addend of its own.
func D(entries ...Entry) Descriptor { return Descriptor{Entries: entries} }

// Request is one ShouldRateLimit request.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	HitsAddend  uint32 // 0 counts as 1, for every descriptor without its own
}

// Proto returns r as the protocol's message.
func (r Request) Proto() *rlspb.RateLimitRequest {
	req := &rlspb.RateLimitRequest{Domain: r.Domain, HitsAddend: r.HitsAddend}
	for _, d := range r.Descriptors {
		pd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			pd.Entries = append(pd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.Limit != nil {
			// The override's unit is envoy.type.v3.RateLimitUnit, numbered as the response's
			// unit for SECOND..YEAR; the peer takes the number as is.
			pd.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: typev3.RateLimitUnit(d.Limit.Unit)}
		}
		if d.HitsAddend != nil {
			pd.HitsAddend = wrapperspb.UInt64(*d.HitsAddend)
		}
		req.Descriptors = append(req.Descriptors, pd)
	}
	return req
}

func (r Request) String() string {
	s := fmt.Sprintf("domain %q", r.Domain)
	if r.HitsAddend != 0 {
		s += fmt.Sprintf(" hits_addend %d", r.HitsAddend)
	}
	for _, d := range r.Descriptors {
		s += " ["
		for i, e := range d.Entries {
			if i > 0 {
				s += ", "
			}
			s += e.Key + "=" + e.Value
		}
		s += "]"
		if d.Limit != nil {
			s += " limit " + d.Limit.String()
		}
		if d.HitsAddend != nil {
			s += fmt.Sprintf(" hits_addend %d", *d.HitsAddend)
		}
	}
	return s
}

// Client calls a rate limit service: the peer's or sluice's, any envoy.service.ratelimit.v3
// server, over plaintext gRPC.
type Client struct {
	conn *grpc.ClientConn
	rls  rlspb.RateLimitServiceClient
	// Extras: the server's answers may carry response_headers_to_add and raw_body, which Run
	// then does not compare (sluice adds the RateLimit fields, Retry-After and a problem body;
	// the peer adds nothing unless told to).
	Extras bool
}

// Dial returns a Client of the service at addr (host:port). It connects lazily, on the first call.
func Dial(addr string) (*Client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("peertest: dialling %s: %w", addr, err)
	}
	return &Client{conn: conn, rls: rlspb.NewRateLimitServiceClient(conn)}, nil
}

// DialTLS is Dial over TLS with tc (a client certificate in it, for a service that requires one).
func DialTLS(addr string, tc *tls.Config) (*Client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("peertest: dialling %s: %w", addr, err)
	}
	return &Client{conn: conn, rls: rlspb.NewRateLimitServiceClient(conn)}, nil
}

// NewClientTLS is DialTLS for a test: it fails the test on an error and closes the Client at its end.
func NewClientTLS(tb testing.TB, addr string, tc *tls.Config) *Client {
	tb.Helper()
	c, err := DialTLS(addr, tc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// NewClient is Dial for a test: it fails the test on an error and closes the Client at its end.
func NewClient(tb testing.TB, addr string) *Client {
	tb.Helper()
	c, err := Dial(addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// ShouldRateLimit asks about descriptors (each a list of entries) in domain, with hitsAddend.
func (c *Client) ShouldRateLimit(ctx context.Context, domain string, descriptors [][]Entry, hitsAddend uint32) (*rlspb.RateLimitResponse, error) {
	r := Request{Domain: domain, HitsAddend: hitsAddend}
	for _, es := range descriptors {
		r.Descriptors = append(r.Descriptors, Descriptor{Entries: es})
	}
	return c.Send(ctx, r)
}

// Send sends r, with its overrides and per-descriptor hits_addend.
func (c *Client) Send(ctx context.Context, r Request) (*rlspb.RateLimitResponse, error) {
	return c.rls.ShouldRateLimit(ctx, r.Proto())
}
