package identity

import (
	"fmt"
	"iter"
	"net/netip"
	"strings"
)

// Default address groups: one IPv4 address, or one IPv6 /64 (what one host, or one customer
// line, is typically given).
const (
	DefaultIPv4Prefix = 32
	DefaultIPv6Prefix = 64
)

// The headers a trusted proxy may report the client's address in.
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded" // RFC 7239
)

// IP identifies an anonymous client by its network address. It never names a configured client:
// Identity.Client is "", and Identity.Key is the address group, "ip:203.0.113.7" or
// "ip:2001:db8:1:2::/64".
//
// The address is the peer's (r.RemoteAddr). Only when the peer is in TrustedProxies is a
// forwarding header believed, and only the one ForwardedHeader names, the one the proxies write:
// X-Forwarded-For (the default; every field line, each a comma-separated list) or Forwarded
// (RFC 7239, its for= parameters: IPv4, or quoted "[IPv6]", either with an optional port). The
// other one, and X-Real-IP, are never read: a proxy that writes one header passes the others on
// from the client unchanged, so they say whatever the client likes. (Were both read, a client
// behind a proxy that writes X-Forwarded-For could add "Forwarded: for=8.8.8.8" and be counted
// as 8.8.8.8, or, if disagreement fell back to the peer, as the proxy, sharing and draining the
// quota of everything counted as the proxy.) The header is walked from the right, the end the
// nearest proxy wrote, skipping addresses that are themselves trusted proxies; the first
// untrusted address is the client. If every address is a trusted proxy, the leftmost one is.
//
// The walk stops conservatively at any entry it cannot use: a malformed address, an element
// without for=, a for= given twice, an obfuscated identifier ("_hidden") or "unknown". The client
// is then the last address the walk reached, which is a trusted proxy (the peer itself if the
// nearest entry is the bad one). Whatever a client sends lies left of the address its proxy
// appended, so the walk stops at that address before it reaches the client's entries: no value a
// client can send, well-formed or not, changes whom it is counted as. For Forwarded, where a
// quoted string may hide commas, a field line that does not parse as a whole (a client's
// unterminated quote would swallow the element its proxy appended to the same line) is split at
// every comma and each piece read as one element, so that the elements proxies appended still
// count.
//
// IPv4-mapped IPv6 addresses (::ffff:192.0.2.1) count as the IPv4 address, zones are dropped,
// and addresses are grouped by IPv4Prefix and IPv6Prefix, so that one host cannot take a fresh
// quota from each of the 2^64 addresses of its /64.
type IP struct {
	TrustedProxies  []netip.Prefix // peers whose forwarding headers are believed (IPv4-mapped prefixes also match IPv4 addresses)
	IPv4Prefix      int            // bits of an IPv4 address that name a client; 0 means 32 (one address)
	IPv6Prefix      int            // bits of an IPv6 address that name a client; 0 means 64
	ForwardedHeader string         // HeaderXForwardedFor or HeaderForwarded: the only header believed, the one the proxies write; "" means HeaderXForwardedFor
}

// Validate reports what is wrong with the configuration; nil if it can be used.
func (ip IP) Validate() error {
	if ip.IPv4Prefix < 0 || ip.IPv4Prefix > 32 {
		return fmt.Errorf("identity: ip: ipv4 prefix /%d must be between /1 and /32 (0 means /32)", ip.IPv4Prefix)
	}
	if ip.IPv6Prefix < 0 || ip.IPv6Prefix > 128 {
		return fmt.Errorf("identity: ip: ipv6 prefix /%d must be between /1 and /128 (0 means /64)", ip.IPv6Prefix)
	}
	for _, p := range ip.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("identity: ip: trusted proxy %v is not a valid prefix", p)
		}
	}
	if _, ok := forwardedHeader(ip.ForwardedHeader); !ok {
		return fmt.Errorf("identity: ip: forwarded header %q is not %q or %q (empty means %[2]q)", ip.ForwardedHeader, HeaderXForwardedFor, HeaderForwarded)
	}
	return nil
}

// Identify returns the anonymous identity of the request's client address. It yields nothing only
// if the peer address cannot be parsed (a Unix socket, say).
func (ip IP) Identify(r Request) (Identity, bool) {
	client, ok := ip.ClientAddr(r)
	if !ok {
		return Identity{}, false
	}
	return Identity{Key: ip.group(client), Source: SourceIP}, true
}

// ClientAddr returns the client's address as described at IP, before grouping.
func (ip IP) ClientAddr(r Request) (netip.Addr, bool) {
	peer, ok := r.Peer()
	if !ok {
		return netip.Addr{}, false
	}
	peer = normalize(peer)
	if !ip.trusted(peer) {
		return peer, true
	}
	hops := ip.hops(r)
	if hops == nil {
		return peer, true
	}
	return ip.walk(peer, hops), true
}

// hops returns the entries of the one forwarding header believed, nearest first; nil if the
// request has none, or the configuration is invalid (it believes nothing).
func (ip IP) hops(r Request) iter.Seq[hop] {
	header, ok := forwardedHeader(ip.ForwardedHeader)
	if !ok {
		return nil
	}
	lines := r.HeaderValues(header)
	switch {
	case len(lines) == 0:
		return nil
	case header == HeaderForwarded:
		return forwardedHops(lines)
	}
	return xffHops(lines)
}

// Behind returns the client's address as ClientAddr does and, when that client is not a trusted
// proxy but the request's forwarding header (the one believed from a trusted proxy) has an entry
// for it to forward, that entry: the address the client says it forwards for. It is not believed
// (a client writes what it likes), but the same client address saying it forwards for many is a
// proxy or gateway missing from TrustedProxies, whose clients are all counted as its address.
// behind is invalid if there is no such entry, or it does not parse.
func (ip IP) Behind(r Request) (client, behind netip.Addr, ok bool) {
	peer, ok := r.Peer()
	if !ok {
		return netip.Addr{}, netip.Addr{}, false
	}
	peer = normalize(peer)
	hops := ip.hops(r)
	if hops == nil { // no header: no allocation, as for most requests (walkBehind's loop has some)
		return peer, netip.Addr{}, true
	}
	client, behind = ip.walkBehind(peer, hops)
	return client, behind, true
}

// walkBehind follows hops (nearest first) from peer, as walk does, to the first address that is
// not a trusted proxy (the peer itself if it is not one), and returns it and the entry after it.
func (ip IP) walkBehind(peer netip.Addr, hops iter.Seq[hop]) (client, behind netip.Addr) {
	client = peer
	found := !ip.trusted(peer)
	for h := range hops {
		if !h.ok {
			break
		}
		if found {
			return client, h.addr
		}
		client, found = h.addr, !ip.trusted(h.addr)
	}
	return client, netip.Addr{}
}

// walk follows hops (nearest first) from the trusted peer; see IP.
func (ip IP) walk(peer netip.Addr, hops iter.Seq[hop]) netip.Addr {
	last := peer // always a trusted proxy
	for h := range hops {
		if !h.ok {
			return last
		}
		if !ip.trusted(h.addr) {
			return h.addr
		}
		last = h.addr
	}
	return last
}

// trusted reports whether a (unmapped, no zone) is in TrustedProxies.
func (ip IP) trusted(a netip.Addr) bool {
	for _, p := range ip.TrustedProxies {
		if p.Contains(a) || a.Is4() && p.Addr().Is4In6() && p.Contains(netip.AddrFrom16(a.As16())) {
			return true
		}
	}
	return false
}

// group returns the identity key of a's group: "ip:" and the address, or its prefix when the
// group is wider than one address.
func (ip IP) group(a netip.Addr) string {
	bits, full := ip.IPv6Prefix, 128
	if bits == 0 {
		bits = DefaultIPv6Prefix
	}
	if a.Is4() {
		bits, full = ip.IPv4Prefix, 32
		if bits == 0 {
			bits = DefaultIPv4Prefix
		}
	}
	var buf [64]byte // "ip:" + the longest IPv6 prefix text (43 bytes): no allocation but the string
	b := append(buf[:0], "ip:"...)
	if bits >= full {
		b = a.AppendTo(b)
	} else {
		p, _ := a.Prefix(bits) // cannot fail: bits is in range and a has no zone
		b = p.AppendTo(b)
	}
	return string(b)
}

// forwardedHeader canonicalises a ForwardedHeader setting ("" is HeaderXForwardedFor); ok is
// false if it names neither header.
func forwardedHeader(h string) (string, bool) {
	switch {
	case h == "":
		return HeaderXForwardedFor, true
	case strings.EqualFold(h, HeaderXForwardedFor):
		return HeaderXForwardedFor, true
	case strings.EqualFold(h, HeaderForwarded):
		return HeaderForwarded, true
	}
	return "", false
}

// ParsePeer parses a peer address as net/http's Request.RemoteAddr has it ("ip:port",
// "[ipv6]:port", or a bare address); ok is false for anything else (a Unix socket's path).
func ParsePeer(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	return netip.Addr{}, false
}

// normalize drops a zone and unmaps an IPv4-mapped IPv6 address.
func normalize(a netip.Addr) netip.Addr { return a.WithZone("").Unmap() }

// hop is one address in a forwarding header; ok is false for an entry the walk must stop at.
type hop struct {
	addr netip.Addr
	ok   bool
}

// xffHops yields the X-Forwarded-For entries from the right: the last field line first, each
// line's list from its end. Empty list elements are skipped (RFC 9110, section 5.6.1).
func xffHops(lines []string) iter.Seq[hop] {
	return func(yield func(hop) bool) {
		for i := len(lines) - 1; i >= 0; i-- {
			line := lines[i]
			for line != "" {
				entry := line
				if j := strings.LastIndexByte(line, ','); j >= 0 {
					entry, line = line[j+1:], line[:j]
				} else {
					line = ""
				}
				entry = strings.Trim(entry, " \t")
				if entry == "" {
					continue
				}
				if !yield(xffHop(entry)) {
					return
				}
			}
		}
	}
}

// xffHop parses one X-Forwarded-For entry: an address, optionally with a port ("192.0.2.1:4711",
// "[2001:db8::1]:4711") or in brackets, as some proxies write them.
func xffHop(s string) hop {
	if a, err := netip.ParseAddr(s); err == nil {
		return hop{normalize(a), true}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return hop{normalize(ap.Addr()), true}
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return hop{normalize(a), true}
		}
	}
	return hop{}
}

// forwardedHops yields the for= nodes of Forwarded (RFC 7239) from the right. Each field line is
// parsed on its own (a quoted string cannot span lines), so a malformed line written by a client
// does not hide the well-formed lines that proxies appended after it; see forwardedLine for a
// malformed line.
func forwardedHops(lines []string) iter.Seq[hop] {
	return func(yield func(hop) bool) {
		var buf [8]hop
		for i := len(lines) - 1; i >= 0; i-- {
			hops := forwardedLine(lines[i], buf[:0])
			for j := len(hops) - 1; j >= 0; j-- {
				if !yield(hops[j]) {
					return
				}
			}
		}
	}
}

// forwardedLine appends to hops the for= nodes of one Forwarded field line. A line that does not
// parse as a whole is split at every comma and each piece parsed on its own, a piece in error
// giving a hop the walk stops at. The syntax error is then the client's: a proxy appends its
// element (which holds no comma) after a comma, to the end of what the client sent, and if that
// ends inside a quoted string, parsing the whole line would swallow the proxy's element and
// count the client as the proxy. Split, the proxy's element is a piece of its own, nearest.
// (A line that parses as a whole does so with the proxy's element intact: a quoted string the
// client left open would end at the proxy's first quote, and what follows it, the start of the
// proxy's quoted value, "[2001:db8::1]" or "192.0.2.1:4711", cannot follow a value.)
func forwardedLine(s string, hops []hop) []hop {
	if all, ok := parseForwardedLine(s, hops); ok {
		return all
	}
	for piece := range strings.SplitSeq(s, ",") {
		hops, _ = parseForwardedLine(piece, hops)
	}
	return hops
}

// parseForwardedLine appends to hops the for= node of each forwarded-element of one field line:
//
//	Forwarded         = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// An element without for=, or with two, gives a stopping hop; so does a syntax error, after
// which the rest of the line is not read and the result is false. Optional whitespace is
// accepted around ";" and ",".
func parseForwardedLine(s string, hops []hop) ([]hop, bool) {
	i := 0
	skipOWS := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
	}
	for {
		skipOWS()
		if i == len(s) {
			return hops, true
		}
		if s[i] == ',' { // an empty list element
			i++
			continue
		}
		// One element: pairs separated by ";".
		var node string
		fors := 0
		for {
			skipOWS()
			if i < len(s) && s[i] != ';' && s[i] != ',' {
				start := i
				for i < len(s) && isTchar(s[i]) {
					i++
				}
				name := s[start:i]
				if name == "" || i == len(s) || s[i] != '=' {
					return append(hops, hop{}), false
				}
				i++
				value, n, ok := forwardedValue(s[i:])
				if !ok {
					return append(hops, hop{}), false
				}
				i += n
				if strings.EqualFold(name, "for") {
					node = value
					fors++
				}
				skipOWS()
			}
			if i < len(s) && s[i] == ';' {
				i++
				continue
			}
			break
		}
		if i < len(s) && s[i] != ',' {
			return append(hops, hop{}), false
		}
		if fors == 1 {
			hops = append(hops, forwardedNode(node))
		} else {
			hops = append(hops, hop{})
		}
	}
}

// forwardedValue reads a token or a quoted-string at the start of s and returns its value and
// how many bytes it took.
func forwardedValue(s string) (value string, n int, ok bool) {
	if s == "" {
		return "", 0, false
	}
	if s[0] != '"' {
		for n < len(s) && isTchar(s[n]) {
			n++
		}
		return s[:n], n, n > 0
	}
	var b strings.Builder
	for n = 1; n < len(s); n++ {
		switch c := s[n]; {
		case c == '"':
			return b.String(), n + 1, true
		case c == '\\':
			n++
			if n == len(s) || !isQuotedPairChar(s[n]) {
				return "", 0, false
			}
			b.WriteByte(s[n])
		case c == '\t' || c == ' ' || c == 0x21 || c >= 0x23 && c <= 0x5B || c >= 0x5D && c <= 0x7E:
			b.WriteByte(c)
		default:
			return "", 0, false
		}
	}
	return "", 0, false // unterminated
}

// forwardedNode parses the value of a for= parameter (RFC 7239, section 6):
//
//	node     = nodename [ ":" node-port ]
//	nodename = IPv4address / "[" IPv6address "]" / "unknown" / obfnode
//
// "unknown" and obfuscated names ("_hidden") give a stopping hop: they say who the client is not.
func forwardedNode(v string) hop {
	var host, port string
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 {
			return hop{}
		}
		host, port = v[1:end], v[end+1:]
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" || !validNodePort(port) {
			return hop{}
		}
		return hop{normalize(a), true}
	}
	host = v
	if j := strings.IndexByte(v, ':'); j >= 0 {
		host, port = v[:j], v[j:]
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() || !validNodePort(port) {
		return hop{} // also "unknown", "_obfuscated", and unbracketed IPv6
	}
	return hop{a, true}
}

// validNodePort reports whether p is empty or ":" node-port, where node-port = port / obfport,
// port = 1*5DIGIT, obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-").
func validNodePort(p string) bool {
	if p == "" {
		return true
	}
	if p[0] != ':' || len(p) == 1 {
		return false
	}
	p = p[1:]
	if p[0] == '_' {
		if len(p) == 1 {
			return false
		}
		for i := 1; i < len(p); i++ {
			c := p[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// isTchar reports whether c may appear in a token (RFC 9110, section 5.6.2).
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isQuotedPairChar reports whether c may follow a backslash in a quoted-string.
func isQuotedPairChar(c byte) bool { return c == '\t' || c >= 0x20 && c <= 0x7E }
