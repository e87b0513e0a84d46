package gateway_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// The addresses of this file's parties, all on loopback: the trusted proxy dials the gateway from
// proxyAddr, clients dial from their own.
const (
	proxyAddr = "127.0.0.2"
	clientA   = "127.0.0.3"
	clientB   = "127.0.0.4"
)

// spoofYAML gives every address 5 requests (a token bucket over an hour: nothing refills while
// the test runs) and trusts only proxyAddr.
const spoofYAML = `
upstream: UPSTREAM
identity:
  - ip: {trusted_proxies: [` + proxyAddr + `/32]FORWARDED_HEADER}
policies:
  - {name: per-ip, algorithm: token-bucket, limit: 5, period: 1h}
default_policy: per-ip
`

// from returns an HTTP client whose connections come from the loopback address local.
func from(t *testing.T, local string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// send makes one GET with the header lines given (each added, so a name may repeat) and returns
// the status.
func send(t *testing.T, c *http.Client, url string, headers ...[2]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// proxyTo runs a real reverse proxy (net/http/httputil) in front of gw that dials it from
// proxyAddr. It appends the client's address to the one header it writes, joined to what the
// client sent in it, and passes every other header on unchanged, as a proxy that knows nothing of
// the others does: "X-Forwarded-For" appends "203.0.113.7", "Forwarded" appends "for=203.0.113.7".
func proxyTo(t *testing.T, gw string, header string) string {
	t.Helper()
	target, err := url.Parse(gw)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyAddr)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	rp := &httputil.ReverseProxy{Transport: tr, Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		// Rewrite starts without the client's X-Forwarded-For and Forwarded: put them back, as
		// a proxy that passes them on would.
		for _, name := range []string{"X-Forwarded-For", "Forwarded"} {
			if v := pr.In.Header.Values(name); len(v) > 0 {
				pr.Out.Header[name] = append([]string(nil), v...)
			}
		}
		client, _, err := net.SplitHostPort(pr.In.RemoteAddr)
		if err != nil {
			t.Errorf("proxy: client address %q: %v", pr.In.RemoteAddr, err)
			return
		}
		entry := client
		if header == "Forwarded" {
			entry = "for=" + client
		}
		if prior := pr.Out.Header.Values(header); len(prior) > 0 {
			entry = strings.Join(prior, ", ") + ", " + entry
		}
		pr.Out.Header.Set(header, entry)
	}}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}

// spoofs are what a client may add to its requests to pass for someone else: another address
// (8.8.8.8, an IPv6 one, the trusted proxy's), in either header or in X-Real-IP, on one line or
// several, and malformed values meant to stop the gateway from reading the header (so that it
// falls back to the proxy's address, a quota shared by everyone the proxy sends).
var spoofs = [][][2]string{
	{},
	{{"Forwarded", "for=8.8.8.8"}},
	{{"Forwarded", `for="[2001:db8::8]:443"`}},
	{{"Forwarded", "for=" + proxyAddr}},
	{{"Forwarded", `for="8.8.8.8`}},
	{{"Forwarded", `for=8.8.8.8;x="`}},
	{{"Forwarded", "for=8.8.8.8;;x"}},
	{{"Forwarded", "for=8.8.8.8"}, {"Forwarded", "for=9.9.9.9"}},
	{{"X-Forwarded-For", "8.8.8.8"}},
	{{"X-Forwarded-For", "2001:db8::8"}},
	{{"X-Forwarded-For", proxyAddr}},
	{{"X-Forwarded-For", "garbage"}},
	{{"X-Forwarded-For", "8.8.8.8, unknown"}},
	{{"X-Forwarded-For", "8.8.8.8"}, {"X-Forwarded-For", "9.9.9.9"}},
	{{"X-Real-IP", "8.8.8.8"}},
	{{"X-Forwarded-For", "8.8.8.8"}, {"Forwarded", "for=9.9.9.9"}, {"X-Real-IP", "7.7.7.7"}},
}

// A client behind a trusted proxy spends its 5 requests; then nothing it adds to its headers
// gets it a fresh quota: every spoof is still counted against its own address (429). The
// proxy's own address, and another client behind the same proxy, keep their whole quotas, so
// the spoofs were not counted as the proxy either. Whichever header the proxy writes.
func TestClientCannotMoveItsIPIdentity(t *testing.T) {
	for _, tt := range []struct{ name, header, config string }{
		{"X-Forwarded-For by default", "X-Forwarded-For", ""},
		{"X-Forwarded-For named", "X-Forwarded-For", ", forwarded_header: X-Forwarded-For"},
		{"Forwarded named", "Forwarded", ", forwarded_header: Forwarded"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			forEachEngine(t, func(t *testing.T, engine string) {
				gw, _ := start(t, engine, strings.ReplaceAll(spoofYAML, "FORWARDED_HEADER", tt.config), newUpstream(t))
				proxy := proxyTo(t, gw.URL, tt.header)
				a := from(t, clientA)
				for i := range 5 {
					if code := send(t, a, proxy+"/x"); code != http.StatusOK {
						t.Fatalf("request %d of 5 through the proxy: %d, want 200", i+1, code)
					}
				}
				for _, h := range spoofs {
					if code := send(t, a, proxy+"/x", h...); code != http.StatusTooManyRequests {
						t.Errorf("spent client, then %q: %d, want 429 (counted against %s still)", h, code, clientA)
					}
				}
				b := from(t, clientB)
				for i := range 5 {
					if code := send(t, b, proxy+"/x"); code != http.StatusOK {
						t.Fatalf("another client behind the proxy, request %d of 5: %d, want 200", i+1, code)
					}
				}
				p := from(t, proxyAddr)
				for i := range 5 {
					if code := send(t, p, gw.URL+"/x"); code != http.StatusOK {
						t.Fatalf("the proxy's own address, request %d of 5: %d, want 200 (no spoof was counted as the proxy)", i+1, code)
					}
				}
			})
		})
	}
}

// A peer that is not a trusted proxy is counted by its own address, whatever forwarding headers
// it sends: once it has spent its 5, no header gets it a fresh quota.
func TestUntrustedPeerCountedByItsAddress(t *testing.T) {
	for _, config := range []string{"", ", forwarded_header: Forwarded"} {
		t.Run(fmt.Sprintf("config %q", config), func(t *testing.T) {
			forEachEngine(t, func(t *testing.T, engine string) {
				gw, _ := start(t, engine, strings.ReplaceAll(spoofYAML, "FORWARDED_HEADER", config), newUpstream(t))
				a := from(t, clientA)
				for i := range 5 {
					if code := send(t, a, gw.URL+"/x", spoofs[(i+1)%len(spoofs)]...); code != http.StatusOK {
						t.Fatalf("request %d of 5 straight from %s: %d, want 200", i+1, clientA, code)
					}
				}
				for _, h := range spoofs {
					if code := send(t, a, gw.URL+"/x", h...); code != http.StatusTooManyRequests {
						t.Errorf("spent untrusted peer, then %q: %d, want 429", h, code)
					}
				}
			})
		})
	}
}
