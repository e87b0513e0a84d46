// Package xds subscribes the rate limit service to an xDS management server for its rules, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW (how Envoy Gateway and Envoy AI Gateway
// feed it): one state-of-the-world ADS stream
// (envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources) asking, as
// node NodeID, for every resource of type ResourceType, a RateLimitConfig per domain.
//
// Each response is the whole set of domains. It is read all or nothing, as a reload reads files
// (envoyconf.FromProto, the files' checks): a valid one is applied and ACKed; an invalid one is
// NACKed with an error_detail that names the resource and the field, and the rules applied last
// keep running. A stream that ends (the server restarts, the network fails) is opened again after
// a capped, jittered exponential backoff, asking again from the version applied last.
package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/rls/envoyconf"
)

// ResourceType is the type URL of the resources subscribed to.
const ResourceType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults of Options' backoff.
const (
	DefaultRetryInitial = time.Second
	DefaultRetryMax     = 30 * time.Second
)

// Options say where to subscribe and as whom.
type Options struct {
	Server       string            // the management server, host:port
	NodeID       string            // the node the server keeps a snapshot for
	NodeMetadata map[string]string // the node's metadata, as strings; may be nil
	TLS          *tls.Config       // nil: plaintext
	// The wait before opening a stream again: RetryInitial after the first failure, doubling up
	// to RetryMax, each wait a random time between its half and itself; reset once a stream has
	// received a response. Zero: DefaultRetryInitial, DefaultRetryMax.
	RetryInitial, RetryMax time.Duration
	Log                    *slog.Logger          // nil: slog.Default()
	Registerer             prometheus.Registerer // where the metrics go; nil: nowhere
}

// Client is a running subscription.
type Client struct {
	opts   Options
	apply  func(*envoyconf.Config)
	node   *corepb.Node
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{}

	loaded     chan struct{} // closed at the first update applied
	loadedOnce sync.Once

	applied, rejected prometheus.Counter
	connected         prometheus.Gauge
}

// Start subscribes and returns at once: apply is called, from one goroutine, with each valid
// update's configuration (every domain the server sent, none if it sent none). Until the first,
// apply is not called at all. The error is for Options that cannot work (no server, no node id).
func Start(o Options, apply func(*envoyconf.Config)) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("xds: no management server")
	}
	if o.NodeID == "" {
		return nil, errors.New("xds: no node id")
	}
	if o.RetryInitial <= 0 {
		o.RetryInitial = DefaultRetryInitial
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	o.RetryMax = max(o.RetryMax, o.RetryInitial)
	if o.Log == nil {
		o.Log = slog.Default()
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	// gRPC reconnects the channel on its own backoff, capped like the streams' so that a server
	// back after an outage is found within RetryMax.
	conn, err := grpc.NewClient(o.Server, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: o.RetryInitial, Multiplier: 2, Jitter: 0.2, MaxDelay: o.RetryMax},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("xds: server %q: %w", o.Server, err)
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range o.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	c := &Client{
		opts: o, apply: apply, conn: conn, done: make(chan struct{}), loaded: make(chan struct{}),
		node: &corepb.Node{Id: o.NodeID, Metadata: md, UserAgentName: "sluice"},
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_rls_xds_connected",
			Help: "1 while the subscription's stream to the xDS management server is open, else 0."}),
	}
	updates := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rls_xds_updates_total",
		Help: "Rate limit configuration updates received over xDS, by result: applied, or rejected (NACKed; the previous rules keep running)."}, []string{"result"})
	c.applied, c.rejected = updates.WithLabelValues("applied"), updates.WithLabelValues("rejected")
	if o.Registerer != nil {
		o.Registerer.MustRegister(updates, c.connected)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return c, nil
}

// Loaded is closed once the first update has been applied.
func (c *Client) Loaded() <-chan struct{} { return c.loaded }

// Stop ends the subscription and waits for it; the rules applied last stay.
func (c *Client) Stop() {
	c.cancel()
	<-c.done
	c.conn.Close()
}

// run opens streams until Stop, waiting between them.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	version := "" // of the update applied last: a new stream asks from there
	wait := c.opts.RetryInitial
	for {
		got, err := c.stream(ctx, &version)
		c.connected.Set(0)
		if ctx.Err() != nil {
			return
		}
		if got {
			wait = c.opts.RetryInitial
		}
		d := wait/2 + rand.N(wait/2+1) // between half the wait and the whole
		wait = min(2*wait, c.opts.RetryMax)
		c.opts.Log.Warn("xds: the stream to the management server ended; opening it again", "server", c.opts.Server, "in", d.Round(time.Millisecond).String(), "error", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// stream runs one ADS stream until it fails; got says whether it received any response.
func (c *Client) stream(ctx context.Context, version *string) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	if err := s.Send(&discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: ResourceType, VersionInfo: *version}); err != nil {
		return false, err
	}
	c.connected.Set(1)
	c.opts.Log.Info("xds: subscribed", "server", c.opts.Server, "node_id", c.opts.NodeID, "version", *version)
	// go-control-plane's server sends a version again as soon as it is NACKed: the NACK of a
	// version already refused waits, doubling from RetryInitial up to RetryMax, so that the two
	// do not loop. The server's next version comes after that wait.
	nacked, nackWait := "", c.opts.RetryInitial
	for {
		resp, err := s.Recv()
		if err != nil {
			return got, err
		}
		got = true
		ack := &discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: ResourceType, ResponseNonce: resp.GetNonce()}
		conf, err := decode(resp)
		if err != nil {
			if v := resp.GetVersionInfo(); v != nacked || v == "" {
				nacked, nackWait = v, c.opts.RetryInitial
				c.rejected.Inc()
				c.opts.Log.Error("xds: update rejected; the previous rules keep running", "version", v, "error", err)
			} else {
				t := time.NewTimer(nackWait)
				select {
				case <-ctx.Done():
					t.Stop()
					return got, ctx.Err()
				case <-t.C:
				}
				nackWait = min(2*nackWait, c.opts.RetryMax)
			}
			ack.VersionInfo = *version
			ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		} else {
			nacked = ""
			c.apply(conf)
			c.applied.Inc()
			c.loadedOnce.Do(func() { close(c.loaded) })
			*version = resp.GetVersionInfo()
			ack.VersionInfo = *version
			c.opts.Log.Info("xds: update applied", "version", *version, "domains", fmt.Sprint(conf.Domains()))
		}
		if err := s.Send(ack); err != nil {
			return got, err
		}
	}
}

// decode reads a response's resources into one configuration.
func decode(resp *discoverypb.DiscoveryResponse) (*envoyconf.Config, error) {
	if t := resp.GetTypeUrl(); t != ResourceType {
		return nil, fmt.Errorf("type_url %q: want %s", t, ResourceType)
	}
	rs := make([]*rlsconfpb.RateLimitConfig, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		rs[i] = &rlsconfpb.RateLimitConfig{}
		if err := a.UnmarshalTo(rs[i]); err != nil {
			return nil, fmt.Errorf("resources[%d]: %w", i, err)
		}
	}
	return envoyconf.FromProto(rs...)
}

// TLSConfig is the TLS to a management server: the server's certificate checked against the CA
// in caFile (the system's roots if ""), for serverName (the address's host if ""), and the client
// certificate in certFile and keyFile if they are set (both or neither).
func TLSConfig(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("xds: tls.ca_file: %w", err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: tls.ca_file %q holds no PEM certificate", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("xds: tls.cert_file and tls.key_file go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("xds: tls.cert_file and tls.key_file: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
