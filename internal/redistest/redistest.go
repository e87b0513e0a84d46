// Package redistest starts real redis-server processes for tests: single servers and a Redis
// Cluster, on free loopback ports, each in its own temporary directory, stopped when the test
// ends. There are no fakes: a test that needs Redis gets Redis (scripts/test.sh installs it).
package redistest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int

	t    testing.TB
	args []string
	dir  string

	tlsConfig *tls.Config // set for StartTLS servers: Do speaks TLS

	mu  sync.Mutex
	cmd *exec.Cmd // guarded by mu; nil while stopped
}

// Start starts a redis-server on a free loopback port, with extra configuration args
// ("--cluster-enabled", "yes", ...), and stops it when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := binary(t, "redis-server")
	port := freePort(t)
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, t: t, dir: t.TempDir()}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--protected-mode", "no"}, args...)
	s.start(bin)
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start(bin string) {
	s.t.Helper()
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	logf, err := os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: starting %s: %v", bin, err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	go cmd.Wait() //nolint:errcheck // reaped here; Kill waits on the process state
	if err := s.waitReady(10 * time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.t.Fatalf("redistest: redis-server on %s did not come up: %v\n%s", s.Addr, err, log)
	}
}

// StartTLS starts a redis-server that speaks only TLS, with a fresh self-signed CA and a
// certificate for 127.0.0.1, and returns it with a TLS config that trusts that CA.
func StartTLS(t testing.TB) (*Server, *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := selfSigned(t)
	for name, data := range map[string][]byte{"ca.crt": caPEM, "server.crt": certPEM, "server.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	port := freePort(t)
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, t: t, dir: t.TempDir(),
		tlsConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}
	s.args = []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--tls-cert-file", filepath.Join(dir, "server.crt"),
		"--tls-key-file", filepath.Join(dir, "server.key"), "--tls-ca-cert-file", filepath.Join(dir, "ca.crt"),
		"--tls-auth-clients", "no"}
	s.start(binary(t, "redis-server"))
	t.Cleanup(s.Kill)
	return s, s.tlsConfig.Clone()
}

func selfSigned(t testing.TB) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// Kill stops the server at once (SIGKILL), as a crash would. It is safe to call twice.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	// Wait until the port is free again, so that Restart can bind it.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(5 * time.Millisecond)
	}
}

// Restart starts the server again on the same port (with an empty dataset and script cache).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start(binary(s.t, "redis-server"))
}

// Do sends one command over a fresh connection and returns the reply as text (RESP2,
// simplified: enough for tests' PING, KEYS, TTL, EXISTS, CLUSTER INFO).
func (s *Server) Do(args ...string) (string, error) {
	return do(s.Addr, s.tlsConfig, args...)
}

// DoAuth is Do on a connection authenticated with password first.
func (s *Server) DoAuth(password string, args ...string) (string, error) {
	return do(s.Addr, s.tlsConfig, append([]string{"\x00auth", password}, args...)...)
}

func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		var reply string
		if reply, err = s.Do("PING"); (err == nil && reply == "PONG") || (err != nil && strings.Contains(err.Error(), "NOAUTH")) {
			return nil // up (and, with --requirepass, asking for a password)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Servers []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// StartCluster starts n cluster-enabled servers, joins them with redis-cli --cluster create
// (slots spread evenly, no replicas) and waits until the cluster reports ok on every node.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.Servers = append(c.Servers, Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary(t, "redis-cli"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Servers {
		for {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ok on %s: %v %s", s.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

func binary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redistest: %s is not installed (bash scripts/test.sh installs it: apt-get install redis-server)", name)
	}
	return path
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// do is a minimal RESP client for test plumbing (the store itself uses a real client library).
func do(addr string, tlsConfig *tls.Config, args ...string) (string, error) {
	var conn net.Conn
	var err error
	if tlsConfig != nil {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, tlsConfig)
	} else {
		conn, err = net.DialTimeout("tcp", addr, time.Second)
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if len(args) >= 2 && args[0] == "\x00auth" {
		if _, err := send(conn, r, "AUTH", args[1]); err != nil {
			return "", err
		}
		args = args[2:]
	}
	return send(conn, r, args...)
}

func send(conn net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(r)
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, n)
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}
