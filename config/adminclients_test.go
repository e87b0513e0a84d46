package config

import (
	"strings"
	"testing"
	"time"
)

// TestAdminClientsFields: admin.tokens are named tokens the listener takes as token_env's, each
// named in the clients API's audit; clients_file and clients_poll say where and how often the
// clients API's records are read. Each bad value is an error naming its field and line.
func TestAdminClientsFields(t *testing.T) {
	cfg, err := parseTest(t, `upstream: http://127.0.0.1:1
admin:
  token_env: SLUICE_ADMIN_TOKEN
  tokens: [{name: ci, token_env: SLUICE_CI_TOKEN}]
  clients_file: clients.journal
  clients_poll: 250ms
`)
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Admin
	if a.ClientsPoll != 250*time.Millisecond || !strings.HasSuffix(a.ClientsFile, "clients.journal") || len(a.Tokens) != 1 {
		t.Fatalf("admin %+v", a)
	}
	for token, want := range map[string]string{"an-admin-token": AdminTokenName, "a-ci-token": "ci", "a-ci-toke": "", "": ""} {
		if got := a.AdminTokenFor(token); got != want {
			t.Errorf("AdminTokenFor(%q) = %q; want %q", token, got, want)
		}
	}
	if !a.HasToken() {
		t.Error("HasToken: false with two tokens")
	}
	if cfg, _ := parseTest(t, "upstream: http://127.0.0.1:1\n"); cfg.Admin.ClientsPoll != DefaultClientsPoll || cfg.Admin.HasToken() {
		t.Errorf("defaults: %+v; want clients_poll %v and no token", cfg.Admin, DefaultClientsPoll)
	}
	for _, c := range []struct{ yaml, want string }{
		{"admin: {clients_poll: 1ms}", "config.yaml:2:23: admin: clients_poll 1ms must be from 10ms to 10s"},
		{"admin: {clients_file: \"\"}", "config.yaml:2:23: admin: clients_file is empty"},
		{"store: {type: redis, addrs: [127.0.0.1:6379]}\nadmin: {clients_file: c.journal}", "config.yaml:3:23: admin: clients_file is for the memory store"},
		{"admin: {tokens: [{token_env: SLUICE_CI_TOKEN}]}", "config.yaml:2:18: admin.tokens[0]: name is required"},
		{"admin: {tokens: [{name: admin, token_env: SLUICE_CI_TOKEN}]}", `config.yaml:2:25: admin.tokens[0]: name "admin" is admin.token_env's`},
		{"admin: {tokens: [{name: ci, token_env: SLUICE_CI_TOKEN}, {name: ci, token_env: SLUICE_BILLING_TOKEN}]}", `admin.tokens[1]: name "ci" is already a token's at line 2`},
		{"admin: {tokens: [{name: 'a b', token_env: SLUICE_CI_TOKEN}]}", `admin.tokens[0]: name "a b" must be 1 to 64`},
		{"admin: {tokens: [{name: ci}]}", "admin.tokens[0]: token_env is required"},
		{"admin: {tokens: [{name: ci, token_env: NOPE}]}", "admin.tokens[0]: missing admin token"},
		{"admin: {tokens: [{name: ci, token_env: SLUICE_CI_TOKEN, x: 1}]}", "admin.tokens[0]"},
	} {
		_, err := parseTest(t, "upstream: http://127.0.0.1:1\n"+c.yaml+"\n")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error with %q", c.yaml, err, c.want)
		}
	}
}
