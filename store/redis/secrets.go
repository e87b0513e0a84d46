package redis

import (
	"errors"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice"
)

// Credentials never leave the store in an error or a log line: every error of New, and every
// error of connecting later (which the store keeps and logs), passes through redact, which writes
// each credential of the options — the URL's userinfo and password (as written and decoded), the
// Password and the Sentinel's password — as "xxxxx". A malformed URL is quoted by the URL parser
// whole, password included; rueidis's connect errors name addresses, which a credential may
// have been written into by mistake.

// credentials returns the secrets of opts that must not appear in an error, longest first.
func credentials(opts *Options) []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s)
		}
	}
	add(opts.Password)
	if opts.Sentinel != nil {
		add(opts.Sentinel.Password)
	}
	if u := opts.URL; u != "" {
		rest := u
		if i := strings.Index(rest, "://"); i >= 0 {
			rest = rest[i+3:]
		}
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			info := rest[:at]
			add(info) // the whole userinfo, user:password
			if _, pass, ok := strings.Cut(info, ":"); ok {
				add(pass)
				if dec, err := url.PathUnescape(pass); err == nil {
					add(dec)
				}
			}
		}
	}
	// Longest first: a password inside the userinfo is replaced with it.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// redact returns err with every secret in its text written as "xxxxx". The error it returns
// still matches the sentinel errors err matched (errors.Is), but does not unwrap to err, whose
// text has the secrets.
func redact(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	changed := false
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg, changed = strings.ReplaceAll(msg, s, "xxxxx"), true
		}
	}
	if !changed {
		return err
	}
	r := &redactedError{msg: msg}
	for _, e := range []error{sluice.ErrStoreUnavailable, sluice.ErrInvalidPolicy} {
		if errors.Is(err, e) {
			r.is = append(r.is, e)
		}
	}
	return r
}

type redactedError struct {
	msg string
	is  []error
}

func (e *redactedError) Error() string   { return e.msg }
func (e *redactedError) Unwrap() []error { return e.is }
