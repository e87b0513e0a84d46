package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
)

// forwardAuthPath is where proxies send their auth sub-requests: nginx's auth_request, Caddy's
// forward_auth and Traefik's ForwardAuth ask it whether to let a request through.
const forwardAuthPath = "/v1/forward-auth"

// maxForwardAuthBody is as much of a sub-request's body as is read (and thrown away). The
// proxies send none; one that does is not read past this, and its connection is closed after
// the answer, so that a body is never buffered nor waited for beyond it.
const maxForwardAuthBody = 4 << 10

// The header fields a proxy reports the original request in: X-Forwarded-Method and
// X-Forwarded-Uri (Traefik and Caddy set them), or X-Original-Method and X-Original-URI (what
// nginx recipes set, from $request_method and $request_uri). The client's address comes in
// X-Forwarded-For (or Forwarded), read by the ip identity source like the gateway's.
const (
	headerForwardedMethod = "X-Forwarded-Method"
	headerForwardedURI    = "X-Forwarded-Uri"
	headerOriginalMethod  = "X-Original-Method"
	headerOriginalURI     = "X-Original-Uri" // X-Original-URI, canonical
)

// forwardAuth answers a proxy's auth sub-request: it decides the original request (its method,
// URI and client, as the proxy reports them) exactly as the proxy listener would, and answers
// 200 with the RateLimit fields for a request that may go on (after holding the sub-request for
// a leaky bucket's delay), forward_auth.refused_status with Retry-After, the fields and the
// problem for one refused, and the decision layer's problem (503, ...) for one it could not
// decide.
//
// The headers that describe the original request are believed only from the proxies the ip
// identity source trusts (its trusted_proxies): anyone else could name any client address and
// any URI. A sub-request from another address is answered 403, and nothing is decided.
func (s *Server) forwardAuth(w http.ResponseWriter, r *http.Request) {
	g := s.current.Load()
	if r.Body != nil && r.Body != http.NoBody {
		// Read a small body whole, so that the connection can serve the next sub-request (and a
		// held one notices its client leaving); a larger one closes the connection instead.
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxForwardAuthBody))
	}
	peer, ok := identity.ParsePeer(r.RemoteAddr)
	if !ok || !trustedProxy(g.cfg, peer) {
		who := r.RemoteAddr
		if ok {
			who = peer.String()
		}
		answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusForbidden), Status: http.StatusForbidden,
			Detail: fmt.Sprintf("%s answers only the proxies in the ip identity source's trusted_proxies; %s is not one of them, so the request it describes was not decided", forwardAuthPath, who)})
		return
	}
	method, uri, uriHeader, problem := originalRequest(r.Header)
	if problem != nil {
		answer.WriteProblem(w, *problem)
		return
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		// Not quoted: a URI can carry a credential in its query.
		answer.WriteProblem(w, answer.BadRequest(fmt.Sprintf("%s is not a request URI: it must be the original request's target as sent, \"/path?query\" (or an absolute URI)", displayName(uriHeader))))
		return
	}
	path := u.Path
	if path == "" {
		path = "/" // an absolute-form URI with no path
	}
	// The sub-request's header fields are the original request's (the proxies copy them) with
	// X-Forwarded-For set by the proxy, and its peer is the proxy: the ip source walks the header
	// as it would behind the proxy listener.
	req := g.policies.Resolve(forwardedRequest{identity.HTTP(r), u.RawQuery}, method, routePath(path))
	v := g.Decide(r.Context(), &req)
	answer.Headers(w.Header(), v.Decisions, g.cfg.Limits.LegacyHeaders)
	switch v.Outcome {
	case decision.Refused:
		p := v.Problem
		v.Release()
		if status := g.cfg.ForwardAuth.RefusedStatus; status != 0 { // 0: a Config not from Parse
			p.Status = status
		}
		answer.WriteProblem(w, p)
		return
	case decision.Failed:
		p := v.Problem
		v.Release()
		answer.WriteProblem(w, p)
		return
	}
	hold := v.Hold
	v.Release() // the fields are formatted
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the proxy gave up the sub-request: its client left
			t.Stop()
			g.metrics.abandon(req.Client)
			return
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}

// trustedProxy reports whether peer is in the trusted_proxies of cfg's ip identity source (there
// is at most one), matched as the ip source matches them.
func trustedProxy(cfg *config.Config, peer netip.Addr) bool {
	for _, id := range cfg.Identity {
		if id.IP == nil {
			continue
		}
		for _, p := range id.IP.TrustedProxies {
			if p.Contains(peer) || peer.Is4() && p.Addr().Is4In6() && p.Contains(netip.AddrFrom16(peer.As16())) {
				return true
			}
		}
	}
	return false
}

// originalRequest returns the original request's method and URI from a trusted proxy's
// sub-request header, and the field the URI came in, or the 400 problem to answer: neither pair of fields present, one of a
// pair missing, a field sent twice, or both pairs present and disagreeing. The last is refused
// rather than one pair preferred: each proxy sets its own pair and passes the other on from the
// client as it came, so a preference would let a client behind one kind of proxy choose its URI.
func originalRequest(h http.Header) (method, uri, uriHeader string, problem *answer.Problem) {
	bad := func(detail string) (string, string, string, *answer.Problem) {
		p := answer.BadRequest(detail)
		return "", "", "", &p
	}
	var vals [4]string
	for i, name := range [...]string{headerForwardedMethod, headerForwardedURI, headerOriginalMethod, headerOriginalURI} {
		switch lines := h[name]; len(lines) {
		case 0:
		case 1:
			vals[i] = strings.TrimSpace(lines[0])
		default:
			return bad(fmt.Sprintf("%s was sent %d times; the proxy must set it once, replacing any the client sent", displayName(name), len(lines)))
		}
	}
	fm, fu, om, ou := vals[0], vals[1], vals[2], vals[3]
	forwarded, original := fm != "" || fu != "", om != "" || ou != ""
	switch {
	case !forwarded && !original:
		return bad("the original request's method and URI are missing: send X-Forwarded-Method and X-Forwarded-Uri (Traefik and Caddy do), or X-Original-Method and X-Original-URI (nginx: proxy_set_header X-Original-Method $request_method; proxy_set_header X-Original-URI $request_uri;)")
	case forwarded && original && (fm != om || fu != ou):
		return bad("X-Forwarded-Method and X-Forwarded-Uri disagree with X-Original-Method and X-Original-URI; the proxy must set one pair and remove the other, which a client can send")
	case forwarded:
		method, uri, uriHeader = fm, fu, headerForwardedURI
		if fm == "" {
			return bad("X-Forwarded-Uri came without X-Forwarded-Method; send both")
		}
		if fu == "" {
			return bad("X-Forwarded-Method came without X-Forwarded-Uri; send both")
		}
	default:
		method, uri, uriHeader = om, ou, headerOriginalURI
		if om == "" {
			return bad("X-Original-URI came without X-Original-Method; send both (nginx: proxy_set_header X-Original-Method $request_method;)")
		}
		if ou == "" {
			return bad("X-Original-Method came without X-Original-URI; send both (nginx: proxy_set_header X-Original-URI $request_uri;)")
		}
	}
	if !isToken(method) {
		return bad(fmt.Sprintf("the original request's method %q is not an HTTP method", method))
	}
	return method, uri, uriHeader, nil
}

// displayName is how the recipes spell a header field.
func displayName(canonical string) string {
	if canonical == headerOriginalURI {
		return "X-Original-URI"
	}
	return canonical
}

// isToken reports whether s is an RFC 9110 token, as a method is.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// forwardedRequest is a sub-request as the identity sources and key_by read it: its header
// fields (the original request's, as the proxy copies them) and peer, with the original URI's
// query in place of the sub-request's own.
type forwardedRequest struct {
	identity.Request
	rawQuery string
}

func (f forwardedRequest) Query(name string) string { return identity.QueryValue(f.rawQuery, name) }
