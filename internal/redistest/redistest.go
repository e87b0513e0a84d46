// Package redistest starts real redis-server processes for tests: single servers, primaries with
// replicas, sentinels and a Redis Cluster (with or without replicas), on free loopback ports, each in its own temporary directory, stopped when the test
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
	"syscall"
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
	auth      string      // --requirepass of StartReplicated servers: Info and the waits for replicas log in

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

// Tx runs cmds as one transaction (MULTI, the commands, EXEC) over a fresh connection and returns
// each command's reply as Do would. Redis runs them together, no other client's command between
// them: a test can read two things at one instant, or mark in MONITOR's stream the instant it
// read something.
func (s *Server) Tx(cmds ...[]string) ([]string, error) {
	var conn net.Conn
	var err error
	if s.tlsConfig != nil {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.Addr, s.tlsConfig)
	} else {
		conn, err = net.DialTimeout("tcp", s.Addr, time.Second)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := send(conn, r, "MULTI"); err != nil {
		return nil, err
	}
	for _, c := range cmds {
		if q, err := send(conn, r, c...); err != nil || q != "QUEUED" {
			return nil, fmt.Errorf("%v in MULTI: %q %v", c, q, err)
		}
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nEXEC\r\n")); err != nil {
		return nil, err
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if n, err := strconv.Atoi(strings.TrimRight(strings.TrimPrefix(head, "*"), "\r\n")); err != nil || n != len(cmds) {
		return nil, fmt.Errorf("EXEC replied %q for %d commands", head, len(cmds))
	}
	replies := make([]string, len(cmds))
	for i := range replies {
		if replies[i], err = readReply(r); err != nil {
			return nil, fmt.Errorf("%v: %w", cmds[i], err)
		}
	}
	return replies, nil
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

// Cluster is a Redis Cluster: its masters, and their replicas if it has any
// (StartClusterReplicas).
type Cluster struct {
	Servers  []*Server // the masters, as started
	Replicas []*Server
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
	createCluster(t, c.Servers, 0)
	return c
}

// createCluster joins servers with redis-cli --cluster create, with replicas replicas per master,
// and waits until every node reports the cluster ok and every replica's link to its master is
// up; it returns the deadline it waited against (30 s from the start).
func createCluster(t testing.TB, servers []*Server, replicas int) time.Time {
	t.Helper()
	args := []string{"--cluster", "create"}
	for _, s := range servers {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary(t, "redis-cli"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range servers {
		for {
			info, err := s.Do("CLUSTER", "INFO")
			ok := err == nil && strings.Contains(info, "cluster_state:ok")
			if ok && replicas > 0 && s.Info("replication", "role") == "slave" {
				ok = s.Info("replication", "master_link_status") == "up"
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ok on %s: %v %s", s.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return deadline
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
	return doWithin(addr, tlsConfig, 5*time.Second, args...)
}

// doTimeout is do without TLS, giving up after timeout.
func doTimeout(addr string, timeout time.Duration, args ...string) (string, error) {
	return doWithin(addr, nil, timeout, args...)
}

func doWithin(addr string, tlsConfig *tls.Config, timeout time.Duration, args ...string) (string, error) {
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
	_ = conn.SetDeadline(time.Now().Add(timeout))
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
	if _, err := conn.Write(Command(args...)); err != nil {
		return "", err
	}
	return readReply(r)
}

// Command is args as one RESP command, the bytes a client sends.
func Command(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// Conn is one plain connection speaking RESP, for tests that hold a connection open and look at
// what happens to it (through a proxy that delays or cuts it, say). A reply is read as do reads
// it: an error reply is an error, an array its elements joined with newlines.
type Conn struct {
	net.Conn
	r *bufio.Reader
}

// Dial connects to addr within timeout.
func Dial(addr string, timeout time.Duration) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: c, r: bufio.NewReader(c)}, nil
}

// Do sends one command and reads its reply (with no deadline but the one set on c).
func (c *Conn) Do(args ...string) (string, error) { return send(c.Conn, c.r, args...) }

// Send sends one command without reading its reply.
func (c *Conn) Send(args ...string) error {
	_, err := c.Write(Command(args...))
	return err
}

// Reply reads one reply.
func (c *Conn) Reply() (string, error) { return readReply(c.r) }

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

// Stop suspends the server (SIGSTOP), as a hung process or a stalled host would: it keeps its
// connections and answers nothing until Cont.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server suspended by Stop (SIGCONT).
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Running reports whether the server's process runs (it has not been killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// RestartAsReplicaOf starts a killed (or running) server again on its port, empty, as a replica
// of primary ("host:port"): what an operator does to replace a failed node.
func (s *Server) RestartAsReplicaOf(primary string) {
	s.t.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		s.t.Fatalf("redistest: RestartAsReplicaOf(%q): %v", primary, err)
	}
	s.Kill()
	s.args = append(withoutArg(s.args, "--replicaof", 2), "--replicaof", host, port)
	s.start(binary(s.t, "redis-server"))
}

// withoutArg returns args without the option name and its values (n words in all).
func withoutArg(args []string, name string, n int) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == name {
			i += n - 1
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// Info returns one field of INFO section ("role" of "replication"), "" if absent.
func (s *Server) Info(section, field string) string {
	reply, err := s.DoAuth(s.auth, "INFO", section)
	if s.auth == "" {
		reply, err = s.Do("INFO", section)
	}
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(reply, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// Replicated is a primary with replicas (asynchronous replication, as Redis does it).
type Replicated struct {
	Primary  *Server
	Replicas []*Server
}

// StartReplicated starts a primary and n replicas of it (--replicaof), each with the extra args
// (with --requirepass, give --masterauth too), and waits until every replica's link is up and the primary counts them all.
func StartReplicated(t testing.TB, n int, args ...string) *Replicated {
	t.Helper()
	// Any of them may become the primary, and a new replica syncs without the default 5 s delay.
	args = append([]string{"--repl-diskless-sync-delay", "0"}, args...)
	var auth string
	for i, a := range args {
		if a == "--requirepass" && i+1 < len(args) {
			auth = args[i+1]
		}
	}
	g := &Replicated{Primary: Start(t, args...)}
	g.Primary.auth = auth
	for range n {
		r := Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(g.Primary.Port)}, args...)...)
		r.auth = auth
		g.Replicas = append(g.Replicas, r)
	}
	WaitReplicas(t, g.Primary, n, 15*time.Second)
	return g
}

// WaitReplicas waits until primary reports at least n connected replicas whose links are up
// (each replica's INFO says master_link_status:up).
func WaitReplicas(t testing.TB, primary *Server, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if c, _ := strconv.Atoi(primary.Info("replication", "connected_slaves")); c >= n {
			up := 0
			for i := range c {
				// slaveN:ip=127.0.0.1,port=P,state=online,offset=...,lag=...
				if strings.Contains(primary.Info("replication", fmt.Sprintf("slave%d", i)), "state=online") {
					up++
				}
			}
			// Online is not enough: a replica just synced may not answer the primary's
			// REPLCONF GETACK yet, and WAIT (the store's replicas_ack) would time out.
			if up >= n && acked(primary, n) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s has not %d replicas online after %v: %s", primary.Addr, n, timeout, primary.Info("replication", "connected_slaves"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// acked reports whether n replicas acknowledge a write of primary within 100 ms (WAIT).
func acked(primary *Server, n int) bool {
	conn, err := net.DialTimeout("tcp", primary.Addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(conn)
	if primary.auth != "" {
		if _, err := send(conn, r, "AUTH", primary.auth); err != nil {
			return false
		}
	}
	// A write of this connection's: on a cluster node, of a key in one of its slots.
	key := ""
	for i := 0; key == "" && i < 1000; i++ {
		k := "redistest:acked:" + strconv.Itoa(i)
		if _, err := send(conn, r, "SET", k, "1"); err == nil {
			key = k
		} else if !strings.Contains(err.Error(), "MOVED") {
			return false
		}
	}
	if key == "" {
		return false
	}
	if _, err := send(conn, r, "DEL", key); err != nil {
		return false
	}
	got, err := send(conn, r, "WAIT", strconv.Itoa(n), "100")
	k, perr := strconv.Atoi(got)
	return err == nil && perr == nil && k >= n
}

// Sentinels are redis-server processes in sentinel mode (redis-server sentinel.conf --sentinel)
// monitoring one primary under a master name.
type Sentinels struct {
	Servers []*Server
	Master  string // the monitored master's name
	t       testing.TB
}

// SentinelConfig tunes StartSentinels.
type SentinelConfig struct {
	Master          string        // the master name; default "mymaster"
	Quorum          int           // sentinels that must agree the primary is down; default a majority
	DownAfter       time.Duration // down-after-milliseconds; default 1 s
	FailoverTimeout time.Duration // failover-timeout; default 3 s
	AuthPass        string        // the primary's (and replicas') password, if they require one
	RequirePass     string        // the sentinels' own password, if any
}

// StartSentinels starts n sentinels on free loopback ports monitoring primary, and waits until
// each knows the primary and the other sentinels (so that a failover can be voted at once).
func StartSentinels(t testing.TB, primary *Server, n int, cfg SentinelConfig) *Sentinels {
	t.Helper()
	if cfg.Master == "" {
		cfg.Master = "mymaster"
	}
	if cfg.Quorum == 0 {
		cfg.Quorum = n/2 + 1
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout == 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	bin := binary(t, "redis-server")
	ss := &Sentinels{Master: cfg.Master, t: t}
	for range n {
		port := freePort(t)
		s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, t: t, dir: t.TempDir()}
		conf := []string{
			fmt.Sprintf("port %d", port),
			"bind 127.0.0.1",
			"protected-mode no",
			fmt.Sprintf("dir %s", s.dir),
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", cfg.Master, primary.Port, cfg.Quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", cfg.Master, cfg.DownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", cfg.Master, cfg.FailoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", cfg.Master),
		}
		if cfg.AuthPass != "" {
			conf = append(conf, fmt.Sprintf("sentinel auth-pass %s %s", cfg.Master, cfg.AuthPass))
		}
		if cfg.RequirePass != "" {
			conf = append(conf, "requirepass "+cfg.RequirePass)
		}
		path := filepath.Join(s.dir, "sentinel.conf") // the sentinel rewrites it: its own file
		if err := os.WriteFile(path, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.args = []string{path, "--sentinel"}
		s.start(bin)
		t.Cleanup(s.Kill)
		ss.Servers = append(ss.Servers, s)
	}
	// Each sentinel finds the others through the primary's hello channel (every 2 s).
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range ss.Servers {
		for {
			known := ss.do(s, cfg.RequirePass, "SENTINEL", "SENTINELS", cfg.Master)
			if strings.Count(known, "name\n") >= n-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: sentinel %s knows %d of the %d other sentinels", s.Addr, strings.Count(known, "name\n"), n-1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ss
}

func (ss *Sentinels) do(s *Server, pass string, args ...string) string {
	var reply string
	var err error
	if pass != "" {
		reply, err = s.DoAuth(pass, args...)
	} else {
		reply, err = s.Do(args...)
	}
	if err != nil {
		return ""
	}
	return reply
}

// Addrs returns the sentinels' addresses.
func (ss *Sentinels) Addrs() []string {
	addrs := make([]string, len(ss.Servers))
	for i, s := range ss.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// MasterAddr returns the primary's address as the first sentinel that answers reports it
// (SENTINEL GET-MASTER-ADDR-BY-NAME), "" if none answers. pass: the sentinels' password, if any.
func (ss *Sentinels) MasterAddr(pass string) string {
	for _, s := range ss.Servers {
		if !s.Running() {
			continue
		}
		if hp := strings.Split(ss.do(s, pass, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", ss.Master), "\n"); len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1])
		}
	}
	return ""
}

// WaitNewMaster waits until the sentinels report a primary other than old, and that primary
// says it is one (ROLE master), and returns its address.
func (ss *Sentinels) WaitNewMaster(old, pass string, timeout time.Duration) string {
	ss.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if addr := ss.MasterAddr(pass); addr != "" && addr != old {
			if r, err := do(addr, nil, "ROLE"); err == nil && strings.HasPrefix(r, "master") {
				return addr
			} else if err != nil && strings.Contains(err.Error(), "NOAUTH") && pass != "" {
				return addr
			}
		}
		if time.Now().After(deadline) {
			ss.t.Fatalf("redistest: no new master replacing %s after %v (sentinels say %q)", old, timeout, ss.MasterAddr(pass))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartClusterReplicas starts a Redis Cluster of n masters, each with one replica, whose nodes
// time out after nodeTimeout (cluster-node-timeout): a killed master's replica takes its slots
// over about that long after. It waits until the cluster reports ok on every node and every
// replica is in sync.
func StartClusterReplicas(t testing.TB, n int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	c := &Cluster{}
	var all []*Server
	for range 2 * n {
		all = append(all, Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10), "--repl-diskless-sync-delay", "0"))
	}
	deadline := createCluster(t, all, 1)
	for _, s := range all {
		if s.Info("replication", "role") == "master" {
			c.Servers = append(c.Servers, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	for _, s := range c.Servers {
		WaitReplicas(t, s, 1, max(time.Until(deadline), 10*time.Second))
	}
	return c
}

// WaitPromoted waits until one of the cluster's replicas has become a master (after its master
// was killed) and the cluster reports ok on it, and returns it.
func (c *Cluster) WaitPromoted(t testing.TB, timeout time.Duration) *Server {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, s := range c.Replicas {
			if !s.Running() || s.Info("replication", "role") != "master" {
				continue
			}
			if info, err := s.Do("CLUSTER", "INFO"); err == nil && strings.Contains(info, "cluster_state:ok") {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no replica of the cluster became a master in %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
