package decision

import (
	"crypto/sha256"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice/identity"
)

// Resolve notes, for the diagnosis, the address of every request (an identified client's too,
// through a trusted proxy's X-Forwarded-For) and the hash of an API key that matched no client;
// never a known key's, and never the key itself.
func TestResolveSeen(t *testing.T) {
	p := policies(t, `policies:
  - {name: plain, algorithm: fixed-window, limit: 10, period: 1s}
default_policy: plain
`)
	known := p.Resolve(identity.HTTP(req("GET", "/", "10.1.2.3:1", "X-API-Key", keyA, "X-Forwarded-For", "198.51.100.7")), "GET", "/")
	if known.Who.Client != "partner-a" || known.Seen.Addr != netip.MustParseAddr("198.51.100.7") || known.Seen.HasUnknownKey {
		t.Fatalf("a known key behind a trusted proxy: %+v %+v", known.Who, known.Seen)
	}
	unknown := p.Resolve(identity.HTTP(req("GET", "/", "203.0.113.9:1", "X-API-Key", "nobody-has-this")), "GET", "/")
	if unknown.Who.Client != "" || unknown.Seen.Addr != netip.MustParseAddr("203.0.113.9") || !unknown.Seen.HasUnknownKey ||
		unknown.Seen.UnknownKey != sha256.Sum256([]byte("nobody-has-this")) {
		t.Fatalf("an unknown key: %+v %+v", unknown.Who, unknown.Seen)
	}
	none := p.Resolve(identity.HTTP(req("GET", "/", "203.0.113.9:1")), "GET", "/")
	if none.Seen.HasUnknownKey || !none.Seen.Addr.IsValid() {
		t.Fatalf("no key: %+v", none.Seen)
	}
}
