package redis_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestNewErrorsCarryNoPassword: no error of New quotes a credential — a malformed URL (which the
// URL parser quotes whole), a bad port, database or option, a wrong password against a real
// Redis, a Redis that does not answer, a bad Sentinel address — while the errors still say what
// is wrong and still match sluice.ErrStoreUnavailable where they did.
func TestNewErrorsCarryNoPassword(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "default-secret")
	const secret = "s3cret"
	for _, o := range []redisstore.Options{
		{URL: "redis://user:" + secret + "@host:notaport"},
		{URL: "redis://user:" + secret + "@host:0"},
		{URL: "redis://user:" + secret + "@[::1"},
		{URL: "rediss://:" + secret + "@h:1/x/y"},
		{URL: "redis://user:" + secret + "@host:6379/notadb"},
		{URL: "foo://u:" + secret + "@h:1"},
		{URL: "redis://u:" + secret + "@h%zz:1"},
		{URL: "redis://u:" + secret + "@h:1?dial_timeout=xx"},
		{URL: "redis://u:s3%63ret@host:notaport"}, // percent-encoded
		{URL: "redis://" + secret + "@host:notaport"},
		{URL: "redis://:" + secret + "@" + srv.Addr},                       // the wrong password, Redis refuses
		{Addrs: []string{srv.Addr}, Password: secret},                      // the same, as an option
		{Addrs: []string{"127.0.0.1:notaport" + secret}, Password: secret}, // a password pasted into an address
		{Sentinel: &redisstore.Sentinel{Master: "m", Addrs: []string{"x:" + secret}, Password: secret}},
	} {
		o.Timeout = 200 * time.Millisecond
		s, err := redisstore.New(o)
		if err == nil {
			s.Close()
			t.Errorf("New(%q): no error", o.URL)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "s3%63ret") {
			t.Errorf("New(%q %v): the error quotes the password: %v", o.URL, o.Addrs, err)
		}
		if !strings.Contains(err.Error(), "redis store") {
			t.Errorf("New(%q): the error does not say what failed: %v", o.URL, err)
		}
	}
	// A refused password still wraps ErrStoreUnavailable after redaction.
	_, err := redisstore.New(redisstore.Options{URL: "redis://:" + secret + "@" + srv.Addr, Timeout: 200 * time.Millisecond})
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("wrong password: %v, want ErrStoreUnavailable", err)
	}
}
