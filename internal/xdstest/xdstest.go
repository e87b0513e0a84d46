// Package xdstest runs an xDS management server for rate limit rules in a test, as Envoy Gateway's
// controller serves them to its rate limit service: go-control-plane's server and SnapshotCache,
// in process, on a free loopback port, optionally with TLS that requires client certificates.
//
//	xs := xdstest.Start(t, true)
//	v := xs.Set(t, &rlsconfpb.RateLimitConfig{Name: "a", Domain: "a", Descriptors: ...})
//	// subscribe a client as node xs.NodeID to xs.Addr (with xs.CA, xs.Cert, xs.Key, xs.ServerName;
//	// or start envoyproxy/ratelimit with xs.PeerEnv())
//	xs.WaitAcked(t, v, 1) // one stream has applied it
//
// Resources are RateLimitConfig, one per domain, each with a distinct Name (the cache keys them
// by it). Every Set is a new snapshot version of them all; a client gets the whole set each time.
package xdstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// NodeID is the node whose snapshot Set sets: clients subscribe as it.
const NodeID = "sluice-xdstest"

// ServerName is the name the server's certificate is for (besides 127.0.0.1).
const ServerName = "xds.sluice.test"

// Server is a running management server.
type Server struct {
	Addr   string // host:port
	NodeID string
	// With TLS: the CA that signed the server's and the client's certificates, and a client
	// certificate and its key (PEM files). Empty without TLS.
	CA, Cert, Key string
	ServerName    string // with TLS: what to verify the server's certificate for; else ""

	cache   cache.SnapshotCache
	tls     *tls.Config
	caCert  *x509.Certificate // with TLS: the CA, which also signs PodCerts'
	caKey   *ecdsa.PrivateKey
	mu      sync.Mutex
	gs      *grpc.Server
	version int
	nonces  map[string]string           // response nonce -> its version
	acks    map[int64]string            // stream -> the version it ACKed last
	nacks   map[int64]map[string]string // stream -> version -> its error_detail message
	changed chan struct{}               // closed and replaced at every request
}

// Start starts a server for the test; with useTLS, it requires TLS and a client certificate signed
// by CA. It stops when the test ends.
func Start(tb testing.TB, useTLS bool) *Server {
	tb.Helper()
	s := &Server{NodeID: NodeID, cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil),
		nonces: map[string]string{}, acks: map[int64]string{}, nacks: map[int64]map[string]string{}, changed: make(chan struct{})}
	if useTLS {
		s.makeCerts(tb)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	tb.Cleanup(s.Stop)
	return s
}

// serve serves on ln with a new gRPC server, on the same cache.
func (s *Server) serve(ln net.Listener) {
	cb := server.CallbackFuncs{
		StreamRequestFunc: s.request,
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoverypb.DiscoveryRequest, r *discoverypb.DiscoveryResponse) {
			s.mu.Lock()
			s.nonces[r.GetNonce()] = r.GetVersionInfo()
			s.mu.Unlock()
		},
	}
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	gs := grpc.NewServer(opts...)
	discoverypb.RegisterAggregatedDiscoveryServiceServer(gs, server.NewServer(context.Background(), s.cache, cb))
	s.mu.Lock()
	s.gs = gs
	s.mu.Unlock()
	go func() { _ = gs.Serve(ln) }()
}

// request records an ACK or a NACK.
func (s *Server) request(stream int64, r *discoverypb.DiscoveryRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := r.GetResponseNonce(); n != "" {
		if v, ok := s.nonces[n]; ok {
			if d := r.GetErrorDetail(); d != nil {
				if s.nacks[stream] == nil {
					s.nacks[stream] = map[string]string{}
				}
				s.nacks[stream][v] = d.GetMessage()
			} else {
				s.acks[stream] = v
			}
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// Set makes rs the node's resources, as a new version, and returns the version.
func (s *Server) Set(tb testing.TB, rs ...*rlsconfpb.RateLimitConfig) string {
	tb.Helper()
	s.mu.Lock()
	s.version++
	v := strconv.Itoa(s.version)
	s.mu.Unlock()
	res := make([]types.Resource, len(rs))
	for i, r := range rs {
		res[i] = r
	}
	snap, err := cache.NewSnapshot(v, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	if err := s.cache.SetSnapshot(context.Background(), s.NodeID, snap); err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	return v
}

// WaitAcked waits (up to 30 s, else fails tb) until n streams have ACKed version: their clients
// applied it.
func (s *Server) WaitAcked(tb testing.TB, version string, n int) {
	tb.Helper()
	s.wait(tb, fmt.Sprintf("%d streams to ACK version %s", n, version), func() bool {
		got := 0
		for _, v := range s.acks {
			if v == version {
				got++
			}
		}
		return got >= n
	})
}

// WaitNacked waits (up to 30 s, else fails tb) until n streams have NACKed version, and returns
// their error_detail messages.
func (s *Server) WaitNacked(tb testing.TB, version string, n int) []string {
	tb.Helper()
	var msgs []string
	s.wait(tb, fmt.Sprintf("%d streams to NACK version %s", n, version), func() bool {
		msgs = msgs[:0]
		for _, m := range s.nacks {
			if msg, ok := m[version]; ok {
				msgs = append(msgs, msg)
			}
		}
		return len(msgs) >= n
	})
	return msgs
}

func (s *Server) wait(tb testing.TB, what string, done func() bool) {
	tb.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, changed := done(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("xdstest: waited 30s for %s", what)
		}
	}
}

// Stop stops the server at once, cutting its streams (as a controller that dies); Restart
// serves again.
func (s *Server) Stop() {
	s.mu.Lock()
	gs := s.gs
	s.mu.Unlock()
	gs.Stop()
}

// Restart serves again on the same address, with the same snapshot, after Stop. Streams start
// afresh: WaitAcked counts those opened since.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port was just closed; another process may hold it for a moment
		if ln, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("xdstest: listening again on %s: %v", s.Addr, err)
	}
	s.mu.Lock()
	s.acks, s.nacks = map[int64]string{}, map[int64]map[string]string{}
	s.mu.Unlock()
	s.serve(ln)
}

// PeerEnv is envoyproxy/ratelimit's environment to subscribe to s (see peertest.Options.Env):
// CONFIG_TYPE=GRPC_XDS_SOTW, the CONFIG_GRPC_XDS_* variables, and serving (and healthy) before
// the first update, as sluice does.
func (s *Server) PeerEnv() []string {
	env := []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + s.Addr,
		"CONFIG_GRPC_XDS_NODE_ID=" + s.NodeID,
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=200ms",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=false",
	}
	if s.tls != nil {
		env = append(env,
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+s.CA,
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+s.Cert,
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+s.Key,
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN="+s.ServerName)
	}
	return env
}

// makeCerts makes a CA, the server's certificate (for ServerName and 127.0.0.1) and a client's,
// writes the CA and the client's into files and sets the server's TLS.
func (s *Server) makeCerts(tb testing.TB) {
	tb.Helper()
	dir := tb.TempDir()
	caKey, caCert, caDER := newCert(tb, "xdstest CA", nil, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	})
	srvKey, _, srvDER := newCert(tb, ServerName, caCert, caKey, func(c *x509.Certificate) {
		c.DNSNames, c.IPAddresses = []string{ServerName}, []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	cliKey, _, cliDER := newCert(tb, "xdstest client", caCert, caKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	s.CA, s.Cert, s.Key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	s.ServerName = ServerName
	s.caCert, s.caKey = caCert, caKey
	writePEM(tb, s.CA, "CERTIFICATE", caDER)
	writePEM(tb, s.Cert, "CERTIFICATE", cliDER)
	writePEM(tb, s.Key, "PRIVATE KEY", pkcs8(tb, cliKey))
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	s.tls = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

// PodCerts writes, into a directory of its own, the files of the Secret Envoy Gateway mounts at
// /certs in its rate limit deployment: ca.crt (s's CA), and tls.crt and tls.key, one certificate
// (for ServerName and 127.0.0.1) that the rate limit service both serves its gRPC with and
// presents to s as its client certificate. The files are readable by every user (a container's
// user is not the test's). s must have been started with TLS.
func (s *Server) PodCerts(tb testing.TB) string {
	tb.Helper()
	if s.caCert == nil {
		tb.Fatal("xdstest: PodCerts needs a server started with TLS")
	}
	key, _, der := newCert(tb, "envoy-ratelimit", s.caCert, s.caKey, func(c *x509.Certificate) {
		c.DNSNames, c.IPAddresses = []string{ServerName}, []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	})
	dir := tb.TempDir()
	writePEM(tb, filepath.Join(dir, "ca.crt"), "CERTIFICATE", s.caCert.Raw)
	writePEM(tb, filepath.Join(dir, "tls.crt"), "CERTIFICATE", der)
	writePEM(tb, filepath.Join(dir, "tls.key"), "PRIVATE KEY", pkcs8(tb, key))
	for _, f := range []string{dir, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")} {
		mode := os.FileMode(0o644)
		if f == dir {
			mode = 0o755
		}
		if err := os.Chmod(f, mode); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// newCert makes a certificate for cn, signed by parent (self-signed if nil), edited by edit.
func newCert(tb testing.TB, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, edit func(*x509.Certificate)) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	edit(tmpl)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return key, cert, der
}

func pkcs8(tb testing.TB, k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func writePEM(tb testing.TB, name, typ string, der []byte) {
	if err := os.WriteFile(name, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
