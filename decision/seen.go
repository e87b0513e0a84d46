package decision

import (
	"crypto/sha256"
	"net/netip"

	"github.com/sluicehq/sluice/identity"
)

// Seen is what the operator page's diagnosis (gateway/diagnosis.go) learns of a request besides
// who it names: its network address whoever it names, whom that address says it forwards for,
// and the hash of an API key that named nobody. Never the key itself.
type Seen struct {
	// Addr is the client's address as the chain's ip source resolves it (its trusted proxies'
	// forwarding headers believed), for identified clients too. Invalid if the chain has no ip source or the peer is not an IP address.
	Addr netip.Addr
	// Behind is the address the request's forwarding header says Addr forwards for, when Addr is
	// not a trusted proxy (identity.IP.Behind): not believed, but many of them behind one Addr
	// are many clients counted as one. Invalid if there is none.
	Behind netip.Addr
	// UnknownKey is the SHA-256 of the API key the request carried that matched no client;
	// HasUnknownKey says there was one.
	UnknownKey    [sha256.Size]byte
	HasUnknownKey bool
}

// seen fills req.Seen from r: the ip source's address and whom it forwards for, and an API key
// that named nobody. Only the first source of each kind is asked, as Identify would.
func (p *Policies) seen(r identity.Request, req *Request) {
	ipDone, keyDone := false, false
	for _, s := range p.chain {
		switch s := s.(type) {
		case identity.IP:
			if !ipDone {
				ipDone = true
				if a, behind, ok := s.Behind(r); ok {
					req.Seen.Addr, req.Seen.Behind = a, behind
				}
			}
		case identity.APIKey:
			if !keyDone {
				keyDone = true
				if k := s.Key(r); k != "" && req.Who.Source != identity.SourceAPIKey {
					sum := sha256.Sum256([]byte(k))
					if _, ok := p.cfg.ClientByKeySum(sum); !ok { // (another source may have named it first)
						req.Seen.UnknownKey, req.Seen.HasUnknownKey = sum, true
					}
				}
			}
		}
	}
}
