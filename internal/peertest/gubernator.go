package peertest

// Gubernator (github.com/gubernator-io/gubernator) as a second peer: the rate limiter that issue
// 34's cross-region limit is measured beside. It is built from the Go module proxy as the other
// peer is (install), started as a cluster of real processes on loopback (StartGubernators), and
// spoken to over its gRPC API (GubernatorClient).
//
// How a benchmark uses it: the regions benchmark sends its traffic (demand moving 70/20/10 →
// 10/20/70 over three regions) once to sluice, each region's instances reaching the ledger through
// its own netfault.Proxy with 50–150 ms, and once to StartGubernators(tb, 3), region i's requests
// going to instance i with Behavior GLOBAL and the same limit and window; it counts the admissions
// of both in each window and reports those over the limit, and the time each adds to a request.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

const (
	// GubernatorModule is Gubernator's Go module.
	GubernatorModule = "github.com/gubernator-io/gubernator/v2"
	// GubernatorVersion is the release issue 34 names (newer ones need a newer Go than the
	// project's).
	GubernatorVersion = "v2.13.0"
	// GubernatorPackage is its server command, configured by GUBER_* variables (its config.go).
	GubernatorPackage = GubernatorModule + "/cmd/gubernator"
)

// GubernatorBinary returns the path of Gubernator's server at GubernatorVersion, building it
// first if this machine has not (into os.UserCacheDir()/sluice-peertest/gubernator-<version>;
// about two minutes the first time, with the modules to fetch; nothing after).
func GubernatorBinary(tb testing.TB) string {
	tb.Helper()
	return install(tb, GubernatorPackage, GubernatorVersion, "gubernator", "gubernator-"+GubernatorVersion)
}

// Gubernators is a cluster of Gubernator instances started by StartGubernators.
type Gubernators struct {
	GRPCAddrs []string // each instance's gRPC address, in the order started
	HTTPAddrs []string // each instance's HTTP/JSON gateway
	procs     []*process
}

// StartGubernators starts n Gubernator instances as one cluster and waits until each is healthy
// and knows all n (peer_count n); they are stopped when tb ends, and their logs go into tb's
// output if it failed.
//
// Gubernator v2.13.0 has no static list of peers in its configuration: its discovery is
// member-list (gossip), etcd, DNS or Kubernetes. Member-list is used, as a deployment without
// those services would, with every instance's gossip address as a known node, but it keeps peers
// by IP address and names them by host name, so instances on one machine need their own address
// and host name, as they would have on their own hosts: instance i listens on 127.0.0.(i+1) (the
// loopback range) and runs in a UTS namespace of its own (`unshare --uts`, which needs root, as
// the tests and CI run) whose host name is gubernator-i.
func StartGubernators(tb testing.TB, n int) *Gubernators {
	tb.Helper()
	return StartGubernatorsVia(tb, n, nil)
}

// StartGubernatorsVia is StartGubernators with every instance advertising to its peers the
// address via returns for its gRPC address (nil: the address itself): a proxy in front of it,
// such as a netfault.Proxy adding a region's latency, so that the instances' calls to each
// other (a GLOBAL limit's hits sent to its owner, the owner's updates sent back) cross it. The
// clients of the test still reach each instance directly, at GRPCAddrs.
func StartGubernatorsVia(tb testing.TB, n int, via func(i int, grpcAddr string) string) *Gubernators {
	tb.Helper()
	if n < 1 || n > 250 {
		tb.Fatalf("peertest: %d Gubernator instances: 1 to 250", n)
	}
	bin := GubernatorBinary(tb)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		tb.Fatalf("peertest: Gubernator's instances each need a host name of their own: %v (it is in util-linux)", err)
	}
	g := &Gubernators{}
	hosts := make([]string, n)
	gossip := make([]string, n)
	ports := make([][]int, n)
	for i := range n {
		hosts[i] = fmt.Sprintf("127.0.0.%d", i+1)
		ports[i] = freePortsOn(tb, hosts[i], 3) // gRPC, HTTP, gossip (TCP and UDP)
		gossip[i] = net.JoinHostPort(hosts[i], strconv.Itoa(ports[i][2]))
	}
	for i := range n {
		grpcAddr := net.JoinHostPort(hosts[i], strconv.Itoa(ports[i][0]))
		httpAddr := net.JoinHostPort(hosts[i], strconv.Itoa(ports[i][1]))
		advertise := grpcAddr
		if via != nil {
			advertise = via(i, grpcAddr)
		}
		dir := tb.TempDir()
		name := fmt.Sprintf("gubernator-%d", i)
		// The host name is written into the new namespace's own /proc/sys/kernel/hostname.
		cmd := exec.Command(unshare, "--uts", "sh", "-c",
			`echo "$1" > /proc/sys/kernel/hostname && exec "$2"`, "sh", name, bin)
		cmd.Dir = dir
		cmd.Env = []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
			"GUBER_GRPC_ADDRESS=" + grpcAddr,
			"GUBER_HTTP_ADDRESS=" + httpAddr,
			"GUBER_ADVERTISE_ADDRESS=" + advertise,
			"GUBER_INSTANCE_ID=" + name,
			"GUBER_PEER_DISCOVERY_TYPE=member-list",
			"GUBER_MEMBERLIST_ADDRESS=" + gossip[i],
			"GUBER_MEMBERLIST_BIND_ADDRESS=" + gossip[i],
			"GUBER_MEMBERLIST_KNOWN_NODES=" + strings.Join(gossip, ","),
			"GUBER_LOG_LEVEL=info",
		}
		g.procs = append(g.procs, startProcess(tb, cmd, filepath.Join(dir, "gubernator.log"), name+" "+grpcAddr))
		g.GRPCAddrs = append(g.GRPCAddrs, grpcAddr)
		g.HTTPAddrs = append(g.HTTPAddrs, httpAddr)
	}
	// Stopped all at once, before each process's own cleanup finds it gone, and killed after a
	// second: instances of a cluster told to stop together wait for each other's connections
	// and do not exit by themselves (seen: never within 5 s), and they keep nothing to save.
	tb.Cleanup(func() {
		var wg sync.WaitGroup
		for _, p := range g.procs {
			wg.Go(func() { stopWithin(p.cmd, p.exited, time.Second) })
		}
		wg.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for i, addr := range g.GRPCAddrs {
		c := DialGubernator(tb, addr)
		if err := c.waitCluster(g.procs[i].exited, n, deadline); err != nil {
			g.procs[i].fatal(tb, fmt.Sprintf("Gubernator instance %d (%s) did not join a cluster of %d", i, addr, n), err)
		}
	}
	return g
}

// waitCluster polls the instance's health check until it is healthy with n peers, it exits, or
// deadline passes.
func (c *GubernatorClient) waitCluster(exited <-chan struct{}, n int, deadline time.Time) error {
	last := errors.New("no answer yet")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("it exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := c.Health(ctx)
		cancel()
		switch {
		case err != nil:
			last = err
		case h.Status == "healthy" && h.PeerCount == n:
			return nil
		default:
			last = fmt.Errorf("health: %+v", h)
		}
		select {
		case <-exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not within 60s: %v", last)
}

// freePortsOn is FreePorts on host (a loopback address): n distinct ports free for TCP and UDP
// there, held together while chosen.
func freePortsOn(tb testing.TB, host string, n int) []int {
	tb.Helper()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue // its UDP twin is taken: keep the TCP one held and draw another
		}
		defer u.Close()
		ports = append(ports, port)
	}
	return ports
}

// GubernatorBehavior is a request's behavior (gubernator.proto's Behavior; flags to be or-ed).
type GubernatorBehavior int64

// The behaviors used here.
const (
	GubernatorBatching GubernatorBehavior = 0 // the default: answered by the key's owner
	// GubernatorGlobal answers from the instance's own copy of the count and sends the hits to
	// the owner asynchronously, which sends the count back to every instance: no request waits
	// for another instance, and the instances may admit more than the limit between two syncs.
	GubernatorGlobal GubernatorBehavior = 2
)

// GubernatorRequest is one rate limit request: Hits against Limit per Duration for the counter
// Name/UniqueKey (token bucket, Gubernator's default algorithm).
type GubernatorRequest struct {
	Name, UniqueKey string
	Hits, Limit     int64
	Duration        time.Duration // whole milliseconds
	Behavior        GubernatorBehavior
}

// GubernatorAnswer is the answer to a request.
type GubernatorAnswer struct {
	Over      bool // OVER_LIMIT; false: UNDER_LIMIT, the hits were admitted
	Limit     int64
	Remaining int64
	ResetTime time.Time
	Owner     string // the instance that owns the counter, when the answer says
}

// GubernatorHealth is an instance's health check.
type GubernatorHealth struct {
	Status, Message  string
	PeerCount        int
	AdvertiseAddress string
}

// GubernatorClient talks to one Gubernator instance over its gRPC API (pb.gubernator.V1). It
// encodes the few messages it needs itself (protowire), so sluice's module does not depend on
// Gubernator's.
type GubernatorClient struct{ conn *grpc.ClientConn }

// DialGubernator connects to the instance at addr (a gRPC address of StartGubernators); the
// connection is closed when tb ends.
func DialGubernator(tb testing.TB, addr string) *GubernatorClient {
	tb.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(wireCodec{})))
	if err != nil {
		tb.Fatalf("peertest: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	return &GubernatorClient{conn: conn}
}

// Global sends one hit with behavior GLOBAL against limit per the duration for name/key.
func (c *GubernatorClient) Global(ctx context.Context, name, key string, limit int64, per time.Duration) (GubernatorAnswer, error) {
	return c.Send(ctx, GubernatorRequest{Name: name, UniqueKey: key, Hits: 1, Limit: limit, Duration: per, Behavior: GubernatorGlobal})
}

// Send sends one request in a GetRateLimits call; an answer whose error field is set is an error.
func (c *GubernatorClient) Send(ctx context.Context, r GubernatorRequest) (GubernatorAnswer, error) {
	var req []byte
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendBytes(req, r.encode())
	var resp []byte
	if err := c.conn.Invoke(ctx, "/pb.gubernator.V1/GetRateLimits", &req, &resp); err != nil {
		return GubernatorAnswer{}, err
	}
	var answers [][]byte
	err := eachField(resp, func(num protowire.Number, _ uint64, b []byte) {
		if num == 1 {
			answers = append(answers, b)
		}
	})
	if err != nil {
		return GubernatorAnswer{}, err
	}
	if len(answers) != 1 {
		return GubernatorAnswer{}, fmt.Errorf("gubernator: %d answers to one request", len(answers))
	}
	return decodeAnswer(answers[0])
}

func (r GubernatorRequest) encode() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.Name)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, r.UniqueKey)
	for _, f := range []struct {
		num protowire.Number
		v   int64
	}{{3, r.Hits}, {4, r.Limit}, {5, r.Duration.Milliseconds()}, {7, int64(r.Behavior)}} {
		if f.v != 0 {
			b = protowire.AppendTag(b, f.num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(f.v))
		}
	}
	return b
}

func decodeAnswer(b []byte) (GubernatorAnswer, error) {
	var a GubernatorAnswer
	var msg string
	err := eachField(b, func(num protowire.Number, v uint64, s []byte) {
		switch num {
		case 1:
			a.Over = v == 1
		case 2:
			a.Limit = int64(v)
		case 3:
			a.Remaining = int64(v)
		case 4:
			a.ResetTime = time.UnixMilli(int64(v))
		case 5:
			msg = string(s)
		case 6: // metadata: map<string, string>
			var k, val string
			_ = eachField(s, func(n protowire.Number, _ uint64, e []byte) {
				if n == 1 {
					k = string(e)
				} else if n == 2 {
					val = string(e)
				}
			})
			if k == "owner" {
				a.Owner = val
			}
		}
	})
	if err != nil {
		return a, err
	}
	if msg != "" {
		return a, fmt.Errorf("gubernator: %s", msg)
	}
	return a, nil
}

// Health calls the instance's HealthCheck; an unhealthy instance answers with an error.
func (c *GubernatorClient) Health(ctx context.Context) (GubernatorHealth, error) {
	var h GubernatorHealth
	req, resp := []byte{}, []byte(nil)
	if err := c.conn.Invoke(ctx, "/pb.gubernator.V1/HealthCheck", &req, &resp); err != nil {
		return h, err
	}
	err := eachField(resp, func(num protowire.Number, v uint64, b []byte) {
		switch num {
		case 1:
			h.Status = string(b)
		case 2:
			h.Message = string(b)
		case 3:
			h.PeerCount = int(int32(v))
		case 4:
			h.AdvertiseAddress = string(b)
		}
	})
	return h, err
}

// eachField calls f with each field of the protobuf message b: its number and its value (v for
// a varint, s for bytes); other wire types are skipped.
func eachField(b []byte, f func(num protowire.Number, v uint64, s []byte)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("gubernator: a malformed answer: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("gubernator: a malformed answer: %w", protowire.ParseError(m))
			}
			f(num, v, nil)
			n = m
		case protowire.BytesType:
			s, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("gubernator: a malformed answer: %w", protowire.ParseError(m))
			}
			f(num, 0, s)
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("gubernator: a malformed answer: %w", protowire.ParseError(n))
			}
		}
		b = b[n:]
	}
	return nil
}

// wireCodec sends and receives messages already encoded (*[]byte): the bytes are protobuf, so it
// is named "proto", the content subtype the server decodes them with.
type wireCodec struct{}

func (wireCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("wireCodec: %T is not *[]byte", v)
	}
	return *b, nil
}

func (wireCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("wireCodec: %T is not *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (wireCodec) Name() string { return "proto" }
