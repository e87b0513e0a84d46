package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestNoSecretsPrinted formats a configuration that holds every kind of secret in every way a
// log line might, and finds none of them.
func TestNoSecretsPrinted(t *testing.T) {
	const inlinePassword = "inline-redis-password-9f8e"
	y := up + `store: {type: redis, addrs: [r:6379], password: ` + inlinePassword + `}
identity:
  - jwt: {secret_env: JWT_SECRET}
  - api_key: {}
clients:
  - {name: a, jwt_subject: a}
`
	cfg, err := parseTest(t, y)
	if err != nil {
		t.Fatal(err)
	}
	cfg2, err := parseTest(t, up+"store: {type: redis, url: \"redis://r:6379\", password_env: REDIS_PASSWORD}\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Password.Value() != inlinePassword || cfg.Identity[0].JWT.Secret.Value() != testEnv["JWT_SECRET"] ||
		cfg2.Store.Password.Value() != testEnv["REDIS_PASSWORD"] {
		t.Fatal("the secrets were not loaded")
	}
	secrets := []string{inlinePassword, testEnv["JWT_SECRET"], testEnv["REDIS_PASSWORD"]}
	var outs []string
	for _, c := range []*Config{cfg, cfg2} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			outs = append(outs,
				fmt.Sprintf(verb, c), fmt.Sprintf(verb, *c), fmt.Sprintf(verb, c.Store), fmt.Sprintf(verb, &c.Store),
				fmt.Sprintf(verb, c.Store.Password), fmt.Sprintf(verb, c.Identity))
			for _, id := range c.Identity {
				if id.JWT != nil {
					outs = append(outs, fmt.Sprintf(verb, id.JWT), fmt.Sprintf(verb, *id.JWT), fmt.Sprintf(verb, id.JWT.Secret))
				}
			}
		}
		outs = append(outs, c.String(), fmt.Sprint(c), fmt.Sprintln(c.Store, c.Store.Password))
		if b, err := json.Marshal(c.Store); err == nil {
			outs = append(outs, string(b))
		} else {
			t.Error(err)
		}
	}
	for _, out := range outs {
		for _, s := range secrets {
			if strings.Contains(out, s) || strings.Contains(out, fmt.Sprintf("%x", s)) {
				t.Fatalf("a secret is printed: %s", out)
			}
		}
	}
	if got := fmt.Sprintf("%v|%+v|%#v|%s", cfg.Store.Password, cfg.Store.Password, cfg.Store.Password, Secret{}); got != `[redacted]|[redacted]|config.Secret("[redacted]")|` {
		t.Errorf("Secret prints %s", got)
	}
	if !strings.Contains(cfg.String(), "store redis [r:6379] fail-closed") {
		t.Errorf("String() = %s", cfg)
	}
}

// TestSecretsNotInErrors: a bad secret's error names the variable, never the value.
func TestSecretsNotInErrors(t *testing.T) {
	_, err := parseTest(t, up+"store: {type: redis, url: \"redis://u:s3cr3t-in-url@r:6379\", password: [s3cr3t-in-list]}\n"+
		"identity:\n  - jwt: {algorithms: [HS512], secret_env: SHORT_SECRET}\n")
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{"s3cr3t-in-url", "s3cr3t-in-list", testEnv["SHORT_SECRET"]} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("the error shows %q: %v", s, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 3 {
		t.Errorf("%d errors, want 3: %v", n, err)
	}
}
