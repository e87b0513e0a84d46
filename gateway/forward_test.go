package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
)

// echoed is what the echo upstream saw of a request.
type echoed struct {
	Method, RequestURI, Host     string
	XFF, XForwardedHost, XFProto string
	Hop, KeepAlive, Connection   string
	Kept                         string
	BodyLen                      int
	BodySHA                      string
}

func newEcho(t *testing.T) *upstream {
	u := &upstream{count: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			// A protocol switch: answer 101 on the raw connection, then echo bytes back.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
			return
		}
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		w.Header().Add("Via", "1.1 first")
		w.Header().Add("Via", "1.1 second")
		w.Header().Set("X-Hop-Back", "must not reach the client")
		w.Header().Set("Connection", "X-Hop-Back")
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(echoed{
			Method: r.Method, RequestURI: r.RequestURI, Host: r.Host,
			XFF: strings.Join(r.Header.Values("X-Forwarded-For"), "|"), XForwardedHost: r.Header.Get("X-Forwarded-Host"), XFProto: r.Header.Get("X-Forwarded-Proto"),
			Hop: r.Header.Get("X-Hop"), KeepAlive: r.Header.Get("Keep-Alive"), Connection: r.Header.Get("Connection"), Kept: r.Header.Get("X-Kept"),
			BodyLen: len(body), BodySHA: hex.EncodeToString(sum[:]),
		})
	}))
	t.Cleanup(u.Close)
	return u
}

const forwardYAML = `
upstream: UPSTREAM/base
identity:
  - ip: {trusted_proxies: [127.0.0.2/32]}
policies:
  - {name: open, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: open
`

// What reaches the upstream: the path under the upstream's own, the query as sent, the
// upstream's host with the client's in X-Forwarded-Host, the peer appended to X-Forwarded-For
// (the client's lines in their order), no hop-by-hop fields (nor those Connection names) either
// way, the lines of other fields in their order, and a body streamed whole, sent with
// "Expect: 100-continue" as curl does.
func TestForwarding(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		gw, _ := start(t, engine, forwardYAML, up)
		body := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than the engine buffers
		req, _ := http.NewRequest(http.MethodPut, gw.URL+"/items/a%2Fb?x=1&y=%20", bytes.NewReader(body))
		req.Host = "api.example"
		req.Header.Add("X-Forwarded-For", "198.51.100.1")
		req.Header.Add("X-Forwarded-For", "198.51.100.2")
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "per-hop")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set("X-Kept", "end-to-end")
		req.Header.Set("Expect", "100-continue") // as curl sends with a large body
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got echoed
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		sum := sha256.Sum256(body)
		want := echoed{Method: "PUT", RequestURI: "/base/items/a%2Fb?x=1&y=%20", Host: strings.TrimPrefix(up.URL, "http://"),
			XFF: "198.51.100.1, 198.51.100.2, 127.0.0.1", XForwardedHost: "api.example", XFProto: "http",
			Kept: "end-to-end", BodyLen: len(body), BodySHA: hex.EncodeToString(sum[:])}
		if got != want {
			t.Fatalf("upstream saw\n%+v\nwant\n%+v", got, want)
		}
		if v := resp.Header.Get("X-Hop-Back"); v != "" {
			t.Fatalf("a field the upstream's Connection named reached the client: %q", v)
		}
		if v := resp.Header.Values("Via"); len(v) != 2 || v[0] != "1.1 first" || v[1] != "1.1 second" {
			t.Fatalf("the upstream's Via lines arrived as %q, want them in order", v)
		}
		if resp.Header.Get("RateLimit-Policy") == "" {
			t.Fatal("no RateLimit-Policy on a forwarded answer")
		}
	})
}

// An upgrade (a WebSocket, say) is tunnelled: the upstream's 101, then bytes both ways.
func TestUpgradeTunnel(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		gw, _ := start(t, engine, forwardYAML, up)
		resp, br, c, err := rawExchange(t, gw, "GET /chat HTTP/1.1\r\nHost: api.example\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		fmt.Fprint(c, "ping")
		buf := make([]byte, 4)
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("through the tunnel: %q %v", buf, err)
		}
	})
}

// An upstream that is down is a 502 with a problem body, counted, never a hang.
func TestUpstreamDown(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		gw, _ := start(t, engine, forwardYAML, up)
		up.Close()
		resp, err := http.Get(gw.URL + "/x")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "upstream") {
			t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
}

// A client that asks to close gets its answer and a closed connection.
func TestConnectionClose(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		gw, _ := start(t, engine, forwardYAML, up)
		resp, br, _, err := rawExchange(t, gw, "GET /bye HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after Connection: close, the connection stayed open (%v)", err)
		}
	})
}

// What the fasthttp listener cannot read gets a problem body and a closed connection: 431 for
// a header over 32 KiB, 400 for what is not HTTP; neither quotes the request back.
func TestUnreadableRequests(t *testing.T) {
	up := newEcho(t)
	gw, _ := start(t, "fasthttp", forwardYAML, up)
	for _, tt := range []struct {
		raw  string
		want int
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\nX-API-Key: secret-" + strings.Repeat("k", 40<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"NOT HTTP AT ALL secret-key\r\n\r\n", http.StatusBadRequest},
	} {
		resp, _, _, err := rawExchange(t, gw, tt.raw)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tt.want || resp.Header.Get("Content-Type") != "application/problem+json" || strings.Contains(string(body), "secret") {
			t.Fatalf("%.30q: %d %q %s", tt.raw, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
}

// An upstream that stops answering is a 504 once it has been silent for the idle timeout.
func TestUpstreamSilent(t *testing.T) {
	old := gateway.SetUpstreamIdle(300 * time.Millisecond)
	defer gateway.SetUpstreamIdle(old)
	forEachEngine(t, func(t *testing.T, engine string) {
		release := make(chan struct{})
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
		defer up.Close()
		defer close(release) // first: the server's Close waits for its handlers
		gw, _ := start(t, engine, forwardYAML, up)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(gw.URL + "/slow")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("silent upstream: %d, want 504", resp.StatusCode)
		}
	})
}

// An HTTP/1.0 upstream that ends its body by closing: the client gets the whole body, in this
// server's HTTP/1.1, and its connection stays usable.
func TestHTTP10Upstream(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					br := bufio.NewReader(c)
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
				}()
			}
		}()
		up := &upstream{Server: &httptest.Server{URL: "http://" + ln.Addr().String()}}
		gw, _ := start(t, engine, forwardYAML, up)
		for i := 0; i < 2; i++ {
			resp, err := http.Get(gw.URL + "/old")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "until the end" || resp.ProtoMinor != 1 {
				t.Fatalf("request %d: %s %d %q", i, resp.Proto, resp.StatusCode, body)
			}
		}
	})
}

// A header that does not arrive in time gets a 408 with a problem body, and the connection closes.
func TestSlowHeader(t *testing.T) {
	old := gateway.SetHeaderTimeout(300 * time.Millisecond)
	defer gateway.SetHeaderTimeout(old)
	up := newEcho(t)
	gw, _ := start(t, "fasthttp", forwardYAML, up)
	resp, br, _, err := rawExchange(t, gw, "GET / HTTP/1.1\r\nHost: a\r\n") // and no more
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the connection stayed open (%v)", err)
	}
}

// rawExchange sends raw to the gateway on a connection of its own (closed when the test ends,
// and given 5 s) and reads one response's header; the reader and the connection stay usable.
func rawExchange(t *testing.T, gw *frontend, raw string) (*http.Response, *bufio.Reader, net.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	return resp, br, c, err
}

// Answers of every size and framing arrive whole, one after another on one kept-alive connection
// each side: short answers of known length (taken whole from what the upstream had sent with
// the header), longer ones and chunked ones (streamed); the upstream's one connection is given
// back after each, however the answer was read.
func TestAnswerSizes(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		var conns atomic.Int64
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			body := answerBody(n)
			if r.URL.Query().Get("chunked") == "" {
				w.Header().Set("Content-Length", strconv.Itoa(n))
				_, _ = w.Write(body)
				return
			}
			for len(body) > 0 { // flushed in pieces: chunked, the pieces apart
				k := min(len(body), 1000)
				_, _ = w.Write(body[:k])
				http.NewResponseController(w).Flush()
				body = body[k:]
			}
		}))
		up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		up.Start()
		t.Cleanup(up.Close)
		gw, _ := start(t, engine, forwardYAML, up)
		client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
		defer client.CloseIdleConnections()
		for round := range 3 {
			for _, q := range []string{"n=0", "n=1", "n=100", "n=3000", "n=5000", "n=70000", "n=100&chunked=1", "n=70000&chunked=1", "n=2"} {
				resp, err := client.Get(gw.URL + "/sizes?" + q)
				if err != nil {
					t.Fatalf("round %d, %s: %v", round, q, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				vals, _ := url.ParseQuery(q)
				n, _ := strconv.Atoi(vals.Get("n"))
				if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, answerBody(n)) {
					t.Fatalf("round %d, %s: %d, %d bytes, %v; want 200 and the upstream's %d bytes", round, q, resp.StatusCode, len(got), err, n)
				}
				if vals.Get("chunked") == "" && resp.ContentLength != int64(n) {
					t.Fatalf("round %d, %s: Content-Length %d, want %d", round, q, resp.ContentLength, n)
				}
			}
		}
		if got := conns.Load(); got != 1 {
			t.Fatalf("the upstream saw %d connections, want 1: each answer read whole gives its connection back", got)
		}
	})
}

// answerBody is n bytes that differ from one position to the next.
func answerBody(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26 + i/26%7)
	}
	return b
}
