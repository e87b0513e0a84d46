package identity

import (
	"crypto"
	"errors"
	"sync/atomic"
	"time"
)

// The jwt source lives in its own package, github.com/sluicehq/sluice/identity/jwt, the only one
// that imports a JWT library: this package, the decision layer and the net/http middleware do not,
// so a program that never verifies a token does not carry the library. Code that builds sources
// from a configuration (decision.Chain) makes a jwt source with NewJWT, which package jwt
// provides when the program imports it.

// JWTConfig is a jwt source's configuration: the fields of jwt.Source (see there what each means),
// in the same order.
type JWTConfig struct {
	Header     string
	Algorithms []string
	HMACSecret []byte
	PublicKey  crypto.PublicKey
	Claim      string
	Issuer     string
	Audience   string
	Leeway     time.Duration
	Lookup     func(subject string) (client string, ok bool)
	Now        func() time.Time
}

// ConfigurableSource is a Source whose configuration can be checked before it is used: Validate
// reports what is wrong with it, nil if nothing.
type ConfigurableSource interface {
	Source
	Validate() error
}

// ClaimsSource is a Source that also reads the claims of the request's token (jwt.Source):
// Chain.IdentifyClaims asks it for them. See jwt.Source.IdentifyClaims for what it returns.
type ClaimsSource interface {
	Source
	IdentifyClaims(r Request, names []string) (id Identity, ok bool, claims []string)
}

var jwtSource atomic.Pointer[func(JWTConfig) ConfigurableSource]

// RegisterJWT is called by package jwt, when the program imports it, with how to make its
// Source; NewJWT calls it.
func RegisterJWT(newSource func(JWTConfig) ConfigurableSource) { jwtSource.Store(&newSource) }

// ErrNoJWT is NewJWT's error in a program that does not import package jwt.
var ErrNoJWT = errors.New("identity: jwt: this program cannot verify tokens: it does not import github.com/sluicehq/sluice/identity/jwt")

// NewJWT returns the jwt source (a jwt.Source) of c, not yet validated, or ErrNoJWT.
func NewJWT(c JWTConfig) (ConfigurableSource, error) {
	f := jwtSource.Load()
	if f == nil {
		return nil, ErrNoJWT
	}
	return (*f)(c), nil
}
