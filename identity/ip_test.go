package identity

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

// request builds a real request as a server would see it: from peer, with the given header lines.
func request(t testing.TB, peer string, headers ...[2]string) Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://api.example/orders", nil)
	r.RemoteAddr = peer
	for _, h := range headers {
		r.Header.Add(h[0], h[1])
	}
	return HTTP(r)
}

func xff(v string) [2]string { return [2]string{"X-Forwarded-For", v} }
func fwd(v string) [2]string { return [2]string{"Forwarded", v} }

func prefixes(t testing.TB, ps ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func TestIPKey(t *testing.T) {
	proxy := IP{TrustedProxies: prefixes(t, "10.0.0.0/8", "2001:db8:ffff::/48")}           // whose proxies write X-Forwarded-For (the default)
	fwdProxy := IP{TrustedProxies: proxy.TrustedProxies, ForwardedHeader: HeaderForwarded} // whose proxies write Forwarded
	tests := []struct {
		name    string
		ip      IP
		peer    string
		headers [][2]string
		want    string
	}{
		// The peer alone.
		{name: "peer v4", ip: IP{}, peer: "203.0.113.7:50000", want: "ip:203.0.113.7"},
		{name: "peer bare address", ip: IP{}, peer: "203.0.113.7", want: "ip:203.0.113.7"},
		{name: "peer v6 grouped by /64", ip: IP{}, peer: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", want: "ip:2001:db8:1:2::/64"},
		{name: "peer v6 other host same /64", ip: IP{}, peer: "[2001:db8:1:2::1]:443", want: "ip:2001:db8:1:2::/64"},
		{name: "peer v6 next /64", ip: IP{}, peer: "[2001:db8:1:3::1]:443", want: "ip:2001:db8:1:3::/64"},
		{name: "peer v6 /56", ip: IP{IPv6Prefix: 56}, peer: "[2001:db8:1:2ff::1]:443", want: "ip:2001:db8:1:200::/56"},
		{name: "peer v6 /128", ip: IP{IPv6Prefix: 128}, peer: "[2001:db8:1:2::1]:443", want: "ip:2001:db8:1:2::1"},
		{name: "peer v4 /24", ip: IP{IPv4Prefix: 24}, peer: "203.0.113.7:1", want: "ip:203.0.113.0/24"},
		{name: "peer v4-mapped v6 is v4", ip: IP{}, peer: "[::ffff:203.0.113.7]:80", want: "ip:203.0.113.7"},
		{name: "peer zone dropped", ip: IP{}, peer: "[fe80::1%eth0]:80", want: "ip:fe80::/64"},

		// Forwarding headers from an untrusted peer are never believed.
		{name: "spoofed XFF from untrusted peer", ip: IP{}, peer: "198.51.100.1:1", headers: [][2]string{xff("203.0.113.7")}, want: "ip:198.51.100.1"},
		{name: "spoofed Forwarded from untrusted peer", ip: IP{}, peer: "198.51.100.1:1", headers: [][2]string{fwd("for=203.0.113.7")}, want: "ip:198.51.100.1"},
		{name: "spoofed XFF naming a trusted proxy", ip: proxy, peer: "198.51.100.1:1", headers: [][2]string{xff("10.0.0.1")}, want: "ip:198.51.100.1"},

		// X-Forwarded-For from trusted proxies.
		{name: "XFF from trusted proxy", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "XFF client-supplied entries left of the real one", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("1.2.3.4, 5.6.7.8, 203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "XFF chain of proxies", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("198.51.100.9, 203.0.113.7, 10.0.0.5, 10.1.1.1")}, want: "ip:203.0.113.7"},
		{name: "XFF chain over several lines", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("198.51.100.9"), xff("203.0.113.7, 10.0.0.5"), xff("10.1.1.1")}, want: "ip:203.0.113.7"},
		{name: "XFF empty elements skipped", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff(" , 203.0.113.7 ,, 10.0.0.5,")}, want: "ip:203.0.113.7"},
		{name: "XFF all trusted: leftmost", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("10.0.0.7, 10.0.0.5")}, want: "ip:10.0.0.7"},
		{name: "XFF with ports", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7:4711, 10.0.0.5:80")}, want: "ip:203.0.113.7"},
		{name: "XFF v6 with port", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("[2001:db8:1:2::99]:4711")}, want: "ip:2001:db8:1:2::/64"},
		{name: "XFF v6 bracketed", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("[2001:db8:1:2::99]")}, want: "ip:2001:db8:1:2::/64"},
		{name: "XFF v6 bare", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("2001:db8:1:2::99")}, want: "ip:2001:db8:1:2::/64"},
		{name: "XFF v4-mapped", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("::ffff:203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "XFF trusted v6 proxy hop", ip: proxy, peer: "[2001:db8:ffff::1]:1", headers: [][2]string{xff("203.0.113.7, 2001:db8:ffff::2")}, want: "ip:203.0.113.7"},
		{name: "XFF malformed nearest: peer", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7, not-an-address")}, want: "ip:10.0.0.2"},
		{name: "XFF malformed after a trusted hop: that hop", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7, garbage, 10.0.0.5")}, want: "ip:10.0.0.5"},
		{name: "XFF malformed left of the client is never reached", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("garbage, 203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "XFF unknown stops", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7, unknown")}, want: "ip:10.0.0.2"},
		{name: "XFF leading zeros are malformed", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.007")}, want: "ip:10.0.0.2"},
		{name: "XFF absent: the proxy itself", ip: proxy, peer: "10.0.0.2:1", want: "ip:10.0.0.2"},
		{name: "trusted v4-mapped peer", ip: IP{TrustedProxies: prefixes(t, "127.0.0.0/8")}, peer: "[::ffff:127.0.0.2]:1", headers: [][2]string{xff("203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "v4-mapped trusted prefix", ip: IP{TrustedProxies: prefixes(t, "::ffff:10.0.0.0/104")}, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7")}, want: "ip:203.0.113.7"},

		// Forwarded (RFC 7239) from trusted proxies.
		{name: "Forwarded v4", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=192.0.2.43")}, want: "ip:192.0.2.43"},
		{name: "Forwarded parameter name any case", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("For=192.0.2.43")}, want: "ip:192.0.2.43"},
		{name: "Forwarded quoted v4 with port", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="192.0.2.43:4711"`)}, want: "ip:192.0.2.43"},
		{name: "Forwarded quoted v6 with port", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="[2001:db8:cafe::17]:4711"`)}, want: "ip:2001:db8:cafe::/64"},
		{name: "Forwarded quoted v6", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="[2001:db8:cafe::17]"`)}, want: "ip:2001:db8:cafe::/64"},
		{name: "Forwarded quoted-pair", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="\[2001:db8:cafe::17\]"`)}, want: "ip:2001:db8:cafe::/64"},
		{name: "Forwarded obfuscated port", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="192.0.2.43:_p1"`)}, want: "ip:192.0.2.43"},
		{name: "Forwarded with other parameters", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=192.0.2.43, for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com")}, want: "ip:198.51.100.17"},
		{name: "Forwarded chain of proxies", ip: IP{TrustedProxies: prefixes(t, "10.0.0.0/8", "198.51.100.0/24"), ForwardedHeader: HeaderForwarded}, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=192.0.2.43, for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com")}, want: "ip:192.0.2.43"},
		{name: "Forwarded spaces around separators", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`proto=https ; for=192.0.2.43 ;by=10.0.0.2 , for=10.0.0.9`)}, want: "ip:192.0.2.43"},
		{name: "Forwarded over several lines", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=192.0.2.43"), fwd("for=10.0.0.9;proto=https")}, want: "ip:192.0.2.43"},
		{name: "Forwarded _hidden stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=203.0.113.7, for=_hidden")}, want: "ip:10.0.0.2"},
		{name: "Forwarded unknown stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=203.0.113.7, for=unknown")}, want: "ip:10.0.0.2"},
		{name: "Forwarded quoted unknown stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=203.0.113.7, for="unknown"`)}, want: "ip:10.0.0.2"},
		{name: "Forwarded obfuscated after a trusted hop: that hop", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=203.0.113.7, for=_hidden, for=10.0.0.5")}, want: "ip:10.0.0.5"},
		{name: "Forwarded unquoted v6 is malformed", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=[2001:db8::1]")}, want: "ip:10.0.0.2"},
		{name: "Forwarded bare v6 in quotes is malformed", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="2001:db8::1"`)}, want: "ip:10.0.0.2"},
		{name: "Forwarded element without for stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=203.0.113.7, proto=https;by=10.0.0.2")}, want: "ip:10.0.0.2"},
		{name: "Forwarded for twice stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=203.0.113.7;for=198.51.100.1")}, want: "ip:10.0.0.2"},
		{name: "Forwarded bad port stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="203.0.113.7:123456"`)}, want: "ip:10.0.0.2"},
		{name: "Forwarded unterminated quote on its own line", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="1.2.3.4`), fwd("for=203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "Forwarded unterminated quote cannot swallow the proxy's entry", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="1.2.3.4, for=203.0.113.7`)}, want: "ip:203.0.113.7"},
		{name: "Forwarded garbage line left of the client is never reached", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=1.2.3.4;;x`), fwd("for=203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "Forwarded syntax error: the pieces right of it still count", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=1.2.3.4;;x, for=203.0.113.7`)}, want: "ip:203.0.113.7"},
		{name: "Forwarded syntax error in the nearest piece stops", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=203.0.113.7, for=1.2.3.4;;x`)}, want: "ip:10.0.0.2"},
		{name: "Forwarded bad element value left of the client is never reached", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=not-an-ip, for=203.0.113.7`)}, want: "ip:203.0.113.7"},

		// Only the header the proxies write is read: whatever a client adds to the request, its
		// proxy passes on, so no header but that one, and no entry in it left of the one its
		// proxy appended, may move the client: not to an address of its choice, and not to
		// the proxy (whose quota everything counted as the proxy shares).
		{name: "both agree", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's Forwarded ignored: the XFF address", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=8.8.8.8")}, want: "ip:203.0.113.7"},
		{name: "client's Forwarded v6 ignored", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for="[2001:db8::8]:1"`), xff("203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's Forwarded naming the proxy ignored", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=10.0.0.2")}, want: "ip:203.0.113.7"},
		{name: "client's malformed Forwarded ignored", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), fwd(`for="8.8.8.8`)}, want: "ip:203.0.113.7"},
		{name: "Forwarded alone is not read by default", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{fwd("for=8.8.8.8")}, want: "ip:10.0.0.2"},
		{name: "XFF named", ip: IP{TrustedProxies: proxy.TrustedProxies, ForwardedHeader: "x-forwarded-for"}, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=1.2.3.4")}, want: "ip:203.0.113.7"},
		{name: "X-Real-IP ignored", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("203.0.113.7"), {"X-Real-IP", "8.8.8.8"}}, want: "ip:203.0.113.7"},
		{name: "X-Real-IP alone ignored", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{{"X-Real-IP", "8.8.8.8"}}, want: "ip:10.0.0.2"},
		{name: "client's XFF line before the proxy's", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("8.8.8.8"), xff("203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's XFF naming a trusted proxy", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("10.0.0.9, 203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's garbage XFF line before the proxy's", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff(`"8.8.8.8`), xff("203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's garbage XFF, proxy appends", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("8.8.8.8; for=[::1], unknown, 203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "client's XFF through two proxies", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("8.8.8.8, junk, 203.0.113.7, 10.0.0.5")}, want: "ip:203.0.113.7"},
		{name: "client's v6 XFF", ip: proxy, peer: "10.0.0.2:1", headers: [][2]string{xff("[2001:db8::8]:1, fe80::1%eth0, 2001:db8:1:2::99")}, want: "ip:2001:db8:1:2::/64"},
		{name: "Forwarded named: client's XFF ignored", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{xff("1.2.3.4"), fwd("for=203.0.113.7")}, want: "ip:203.0.113.7"},
		{name: "Forwarded named, none sent", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{xff("1.2.3.4")}, want: "ip:10.0.0.2"},
		{name: "Forwarded: client's open quote, proxy's v6 appended", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=8.8.8.8;x=", for="[2001:db8:cafe::17]:4711"`)}, want: "ip:2001:db8:cafe::/64"},
		{name: "Forwarded: client's open quote pair, proxy appended", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=8.8.8.8;x="\, for=203.0.113.7`)}, want: "ip:203.0.113.7"},
		{name: "Forwarded: client's quoted comma, proxy appended", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=8.8.8.8;x="a, for=9.9.9.9", for=203.0.113.7`)}, want: "ip:203.0.113.7"},
		{name: "Forwarded: client's value missing, proxy appended", ip: fwdProxy, peer: "10.0.0.2:1", headers: [][2]string{fwd(`for=, for=203.0.113.7`)}, want: "ip:203.0.113.7"},

		// An untrusted peer is the client, whatever it sends.
		{name: "untrusted peer with every header", ip: proxy, peer: "198.51.100.1:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=8.8.8.8"), {"X-Real-IP", "9.9.9.9"}}, want: "ip:198.51.100.1"},
		{name: "untrusted peer with every header, Forwarded named", ip: fwdProxy, peer: "198.51.100.1:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=8.8.8.8"), {"X-Real-IP", "9.9.9.9"}}, want: "ip:198.51.100.1"},
		{name: "untrusted peer with garbage", ip: proxy, peer: "198.51.100.1:1", headers: [][2]string{xff("garbage"), fwd(`for="x`)}, want: "ip:198.51.100.1"},
		{name: "untrusted v6 peer with headers", ip: fwdProxy, peer: "[2001:db8:1:2::1]:1", headers: [][2]string{xff("203.0.113.7"), fwd("for=8.8.8.8")}, want: "ip:2001:db8:1:2::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.ip.Validate(); err != nil {
				t.Fatal(err)
			}
			id, ok := tt.ip.Identify(request(t, tt.peer, tt.headers...))
			if !ok {
				t.Fatalf("Identify: no identity, want %s", tt.want)
			}
			want := Identity{Key: tt.want, Source: SourceIP}
			if id != want {
				t.Errorf("Identify = %+v, want %+v", id, want)
			}
		})
	}
}

func TestIPUnparsablePeer(t *testing.T) {
	for _, peer := range []string{"", "@", "/run/sluice.sock", "example.com:80"} {
		if id, ok := (IP{}).Identify(request(t, peer)); ok {
			t.Errorf("peer %q: Identify = %+v, want nothing", peer, id)
		}
		if id := (Chain{IP{}}).Identify(request(t, peer)); id != (Identity{Key: AnonymousKey, Source: SourceNone}) {
			t.Errorf("peer %q: Chain.Identify = %+v, want the anonymous identity", peer, id)
		}
	}
}

func TestIPValidate(t *testing.T) {
	for _, ip := range []IP{
		{IPv4Prefix: 33},
		{IPv4Prefix: -1},
		{IPv6Prefix: 129},
		{TrustedProxies: []netip.Prefix{{}}},
		{ForwardedHeader: "X-Real-IP"},
	} {
		if err := ip.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", ip)
		}
	}
}

// TestIPOverRealConnections runs a real server on loopback: the peer address is the real one.
func TestIPOverRealConnections(t *testing.T) {
	for _, tt := range []struct {
		name    string
		trusted []netip.Prefix
		want    string
	}{
		{"untrusted loopback peer: header ignored", nil, "ip:127.0.0.1"},
		{"trusted loopback peer: header used", prefixes(t, "127.0.0.0/8"), "ip:203.0.113.7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			chain := Chain{IP{TrustedProxies: tt.trusted}}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, chain.Identify(HTTP(r)).Key)
			}))
			defer srv.Close()
			req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if got := strings.TrimSpace(string(body)); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseForwardedLine(f *testing.F) {
	for _, s := range []string{
		"for=192.0.2.43", `for="[2001:db8:cafe::17]:4711"`, "for=_hidden, for=unknown",
		"for=192.0.2.43, for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com", `for="\"`, ";;,,;",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hops, _ := parseForwardedLine(s, nil)
		for _, h := range append(hops, forwardedLine(s, nil)...) {
			if h.ok && (!h.addr.IsValid() || h.addr.Zone() != "" || h.addr.Is4In6()) {
				t.Fatalf("parseForwardedLine(%q) gave address %v", s, h.addr)
			}
		}
	})
}

// FuzzIPIdentify: whatever the headers say, an untrusted peer is the client, and a trusted
// peer's client is the peer or an address written in a header; Behind finds the same client.
func FuzzIPIdentify(f *testing.F) {
	f.Add("203.0.113.7, 10.0.0.5", "for=192.0.2.43, for=10.0.0.9", true)
	f.Add("garbage", `for="[2001:db8::1]:80"`, true)
	f.Add("::ffff:10.0.0.1, unknown", "for=_x;for=1.2.3.4", false)
	ip := IP{TrustedProxies: prefixes(f, "10.0.0.0/8")}
	f.Fuzz(func(t *testing.T, x, fw string, trusted bool) {
		peer := "198.51.100.1:1"
		if trusted {
			peer = "10.0.0.2:1"
		}
		r := request(t, peer, xff(x), fwd(fw))
		a, ok := ip.ClientAddr(r)
		if !ok {
			t.Fatal("no address")
		}
		if c, behind, ok := ip.Behind(r); !ok || c != a || behind.IsValid() && (behind.Zone() != "" || behind.Is4In6()) {
			t.Fatalf("Behind: client %v (ClientAddr: %v), behind %v", c, a, behind)
		}
		switch {
		case !trusted && a != netip.MustParseAddr("198.51.100.1"):
			t.Fatalf("untrusted peer, client %v", a)
		case a.Zone() != "" || a.Is4In6():
			t.Fatalf("client %v not normalised", a)
		case trusted && a != netip.MustParseAddr("10.0.0.2") && !strings.Contains(x+fw, a.String()) && !strings.Contains(strings.ToLower(x+fw), a.StringExpanded()):
			// The address must come from a header (modulo how it was spelt there).
			if a.Is4() || !strings.ContainsAny(x+fw, ":") {
				t.Fatalf("client %v appears in neither header %q nor %q", a, x, fw)
			}
		}
	})
}

// TestIPBehind: the client ClientAddr finds, and the entry its forwarding header has after it (the
// address it says it forwards for), whether the client is the peer or found behind trusted
// proxies; none after a malformed entry, or when every address is a trusted proxy.
func TestIPBehind(t *testing.T) {
	ip := IP{TrustedProxies: prefixes(t, "10.0.0.0/8")}
	fw := IP{TrustedProxies: ip.TrustedProxies, ForwardedHeader: HeaderForwarded}
	for _, c := range []struct {
		ip             IP
		peer           string
		headers        [][2]string
		client, behind string // "" for none
	}{
		{ip, "198.51.100.1:1", nil, "198.51.100.1", ""},
		{ip, "198.51.100.1:1", [][2]string{xff("203.0.113.1, 203.0.113.2")}, "198.51.100.1", "203.0.113.2"},
		{ip, "198.51.100.1:1", [][2]string{xff("203.0.113.1"), xff("::ffff:203.0.113.2")}, "198.51.100.1", "203.0.113.2"},
		{ip, "198.51.100.1:1", [][2]string{fwd("for=203.0.113.2")}, "198.51.100.1", ""}, // not the header believed
		{ip, "198.51.100.1:1", [][2]string{xff("garbage")}, "198.51.100.1", ""},
		{ip, "10.0.0.2:1", [][2]string{xff("203.0.113.1, 198.51.100.1, 10.0.0.3")}, "198.51.100.1", "203.0.113.1"},
		{ip, "10.0.0.2:1", [][2]string{xff("203.0.113.1, unknown, 10.0.0.3")}, "10.0.0.3", ""},
		{ip, "10.0.0.2:1", [][2]string{xff("unknown, 198.51.100.1")}, "198.51.100.1", ""},
		{ip, "10.0.0.2:1", [][2]string{xff("10.0.0.4, 10.0.0.3")}, "10.0.0.4", ""},
		{fw, "10.0.0.2:1", [][2]string{fwd(`for=203.0.113.1, for="[2001:db8::1]:80"`)}, "2001:db8::1", "203.0.113.1"},
	} {
		r := request(t, c.peer, c.headers...)
		client, behind, ok := c.ip.Behind(r)
		want, _ := c.ip.ClientAddr(r)
		if !ok || client != want || client.String() != c.client || behind.IsValid() != (c.behind != "") || c.behind != "" && behind.String() != c.behind {
			t.Errorf("%s %q: client %v, behind %v; want %s (ClientAddr %v), behind %q", c.peer, c.headers, client, behind, c.client, want, c.behind)
		}
	}
}

// FuzzClientCannotMoveIdentity: whatever a client sends in X-Forwarded-For, Forwarded and
// X-Real-IP, behind trusted proxies that append its address to the header they write (joined to
// what the client sent, as net/http/httputil's proxy does, or on a line of their own), it is
// counted by that address: never by one it chose, and never as a proxy.
func FuzzClientCannotMoveIdentity(f *testing.F) {
	for _, s := range [][3]string{
		{"8.8.8.8", "for=8.8.8.8", "8.8.8.8"},
		{"garbage, 10.0.0.9", `for="8.8.8.8`, ""},
		{"", `for=8.8.8.8;x="\`, ""},
		{`"8.8.8.8`, `for=8.8.8.8;x="a, for=9.9.9.9"`, ""},
		{"unknown", `for=8.8.8.8;x="`, "10.0.0.2"},
		{"10.0.0.2, ::ffff:10.0.0.3", `for=;by="`, ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	xffIP := IP{TrustedProxies: prefixes(f, "10.0.0.0/8")}
	fwdIP := IP{TrustedProxies: xffIP.TrustedProxies, ForwardedHeader: HeaderForwarded}
	type proxied struct {
		ip      IP
		header  string
		entries []string // what the proxies append, the client's proxy first
		want    netip.Addr
	}
	cases := []proxied{
		{xffIP, HeaderXForwardedFor, []string{"203.0.113.7"}, netip.MustParseAddr("203.0.113.7")},
		{xffIP, HeaderXForwardedFor, []string{"[2001:db8:cafe::17]:4711", "10.0.0.5"}, netip.MustParseAddr("2001:db8:cafe::17")},
		{fwdIP, HeaderForwarded, []string{"for=203.0.113.7"}, netip.MustParseAddr("203.0.113.7")},
		{fwdIP, HeaderForwarded, []string{`for="[2001:db8:cafe::17]:4711";proto=https`, "for=10.0.0.5"}, netip.MustParseAddr("2001:db8:cafe::17")},
		{fwdIP, HeaderForwarded, []string{`for="203.0.113.7:_p";by="[2001:db8::1]"`}, netip.MustParseAddr("203.0.113.7")},
	}
	f.Fuzz(func(t *testing.T, x, fw, realIP string) {
		sent := map[string]string{HeaderXForwardedFor: x, HeaderForwarded: fw, "X-Real-IP": realIP}
		for _, c := range cases {
			for _, ownLine := range []bool{false, true} {
				r := httptest.NewRequest(http.MethodGet, "http://api.example/", nil)
				r.RemoteAddr = "10.0.0.2:1"
				for name, v := range sent {
					if v != "" {
						r.Header.Add(name, v)
					}
				}
				for _, e := range c.entries {
					if prior := r.Header.Values(c.header); !ownLine && len(prior) > 0 {
						r.Header.Set(c.header, strings.Join(prior, ", ")+", "+e)
					} else {
						r.Header.Add(c.header, e)
					}
				}
				a, ok := c.ip.ClientAddr(HTTP(r))
				if !ok || a != c.want {
					t.Fatalf("%s %q (own line %v): client %v, want %v", c.header, r.Header.Values(c.header), ownLine, a, c.want)
				}
			}
		}
	})
}

func BenchmarkIPIdentify(b *testing.B) {
	b.Run("peer", func(b *testing.B) {
		ip := IP{}
		r := request(b, "203.0.113.7:50000")
		b.ReportAllocs()
		for b.Loop() {
			ip.Identify(r)
		}
	})
	b.Run("trusted-xff", func(b *testing.B) {
		ip := IP{TrustedProxies: prefixes(b, "10.0.0.0/8")}
		r := request(b, "10.0.0.2:1", xff("198.51.100.9, 203.0.113.7, 10.0.0.5"))
		b.ReportAllocs()
		for b.Loop() {
			ip.Identify(r)
		}
	})
	b.Run("trusted-forwarded-v6", func(b *testing.B) {
		ip := IP{TrustedProxies: prefixes(b, "10.0.0.0/8"), ForwardedHeader: HeaderForwarded}
		r := request(b, "10.0.0.2:1", fwd(`for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.5`))
		b.ReportAllocs()
		for b.Loop() {
			ip.Identify(r)
		}
	})
}
