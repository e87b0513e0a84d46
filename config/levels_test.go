package config

import (
	"errors"
	"strings"
	"testing"
)

// levelsBase: an organisation with two teams; usage routes count tokens and dollars.
const levelsBase = up + `identity: [api_key: {}]
policies:
  - {name: key-tpm, algorithm: fixed-window, limit: 1000, period: 1m}
  - {name: team-tpm, algorithm: fixed-window, limit: 5000, period: 1m}
  - {name: team-usd, algorithm: fixed-window, limit: $500, calendar: month, counts: usd}
  - {name: org-usd, algorithm: fixed-window, limit: $900, calendar: month, counts: usd}
  - {name: org-rpm, algorithm: fixed-window, limit: 10, period: 1m, counts: requests}
  - {name: by-path, algorithm: fixed-window, limit: 10, period: 1m, key_by: [path]}
routes:
  - {path_prefix: /v1/chat, usage: {format: openai}}
  - {path_prefix: /plain, policy: [key-tpm]}
models:
  - {name: m, price: {input: 1, output: 2}}
`

func init() {
	// (TestErrors and FuzzParse take these with the others.)
	errorCases = append(errorCases, []struct {
		name string
		yaml string
		want []wantErr
	}{
		{"levels: unknown team", levelsBase + "teams: [{name: ml, policy: team-tpm}]\nclients:\n  - {name: k1, api_key_sha256: " + hashA + ", team: ops}\n",
			[]wantErr{at(17, `clients[0] "k1": team "ops" is not defined in teams (known: ml)`)}},
		{"levels: unknown organisation of a client", levelsBase + "clients:\n  - {name: k1, api_key_sha256: " + hashA + ", organisation: acme}\n",
			[]wantErr{at(16, `organisation "acme" is not defined in organisations (no organisations are configured)`)}},
		{"levels: a team's unknown organisation", levelsBase + "organisations: [{name: acme, policy: org-usd}]\nteams:\n  - {name: ml, organisation: acm, policy: team-tpm}\n",
			[]wantErr{at(17, `teams[0] "ml": organisation "acm" is not defined in organisations (known: acme)`)}},
		{"levels: a client's organisation is not its team's", levelsBase + "organisations: [{name: acme, policy: org-usd}, {name: beta, policy: org-usd}]\n" +
			"teams: [{name: ml, organisation: acme, policy: team-tpm}]\nclients:\n  - {name: k1, api_key_sha256: " + hashA + ", team: ml, organisation: beta}\n",
			[]wantErr{at(18, `organisation "beta" is not its team's: team "ml" is in organisation "acme"`)}},
		{"levels: names", levelsBase + "teams:\n  - {name: m/l, policy: team-tpm}\n  - {name: ok, policy: team-tpm}\n  - {name: ok, policy: team-tpm}\n",
			[]wantErr{at(16, `name "m/l" may only have A-Z, a-z, 0-9`), at(18, `name "ok" is already used at line 17`)}},
		{"levels: policies", levelsBase + "organisations:\n  - {name: acme}\n  - {name: b, policy: [nope, by-path], organisation: x}\n",
			[]wantErr{at(16, `organisations[0] "acme": policy is required`), at(17, `organisations[1] "b": policy[0] "nope" is not defined in policies`),
				at(17, `policy "by-path" has a key_by`), at(17, `unknown field "organisation" (known: name, policy)`)}},
	}...)
}

// TestLevels: a client in a team is charged its team's policies under "team:NAME" and its team's
// organisation's under "org:NAME", after its own, on every route; tokens and dollars only on
// usage routes; a client named in an organisation without a team, its organisation's only.
func TestLevels(t *testing.T) {
	cfg, err := parseTest(t, levelsBase+`organisations:
  - {name: acme, policy: [org-usd, org-rpm]}
teams:
  - {name: ml, organisation: acme, policy: [team-usd, team-tpm]}
  - {name: loose, policy: team-tpm}
clients:
  - {name: k1, api_key_sha256: `+hashA+`, policy: [key-tpm], team: ml}
  - {name: k2, api_key_sha256: `+sum("b")+`, organisation: acme}
  - {name: k3, api_key_sha256: `+sum("c")+`, team: loose}
  - {name: k4, api_key_sha256: `+sum("d")+`}
`)
	if err != nil {
		t.Fatal(err)
	}
	chat, _ := cfg.Route("POST", "/v1/chat")
	plain, _ := cfg.Route("GET", "/plain")
	if ml, ok := cfg.TeamByName("ml"); !ok || ml.Organisation != "acme" || strings.Join(ml.Policy, ",") != "team-usd,team-tpm" {
		t.Errorf("team ml: %+v", ml)
	}
	if _, ok := cfg.OrganisationByName("ml"); ok {
		t.Error("ml is a team, not an organisation")
	}
	show := func(cl string, rt *Route) string {
		c, _ := cfg.ClientByName(cl)
		var parts []string
		for _, a := range cfg.LevelsFor(c, rt) {
			parts = append(parts, a.Key+" "+a.Policy.Name+" "+a.Unit.String()+" "+a.Level)
		}
		return strings.Join(parts, "; ")
	}
	for _, c := range []struct {
		client string
		route  *Route
		want   string
	}{
		{"k1", chat, `team:ml team-usd usd team "ml"; team:ml team-tpm tokens team "ml"; org:acme org-usd usd organisation "acme"; org:acme org-rpm requests organisation "acme"`},
		{"k1", plain, `team:ml team-tpm requests team "ml"; org:acme org-rpm requests organisation "acme"`},
		{"k1", nil, `team:ml team-tpm requests team "ml"; org:acme org-rpm requests organisation "acme"`},
		{"k2", chat, `org:acme org-usd usd organisation "acme"; org:acme org-rpm requests organisation "acme"`},
		{"k3", chat, `team:loose team-tpm tokens team "loose"`},
		{"k4", chat, ``},
	} {
		if got := show(c.client, c.route); got != c.want {
			t.Errorf("%s on %v:\n got %s\nwant %s", c.client, c.route, got, c.want)
		}
	}
	if k1, _ := cfg.ClientByName("k1"); k1.Organisation != "acme" || k1.Team != "ml" {
		t.Errorf("k1 is in team %q of organisation %q, want ml of acme", k1.Team, k1.Organisation)
	}
	// The client's own limits stay its own (Key "": its key).
	k1, _ := cfg.ClientByName("k1")
	for _, a := range cfg.AppliedPoliciesFor(k1, plain) {
		if a.Key != "" || a.Level != "" {
			t.Errorf("k1's own %s: key %q level %q", a.PolicyName, a.Key, a.Level)
		}
	}
	if cfg.LevelsFor(nil, chat) != nil {
		t.Error("an anonymous request has levels")
	}
}

// TestLevelsWithClients: clients merged into a configuration at runtime are checked for their
// team and organisation as the file's are, and charged their groups' policies like them.
func TestLevelsWithClients(t *testing.T) {
	cfg, err := parseTest(t, levelsBase+`organisations: [{name: acme, policy: org-rpm}, {name: beta, policy: org-rpm}]
teams: [{name: ml, organisation: acme, policy: team-tpm}]
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cl    Client
		field string
	}{
		{Client{Team: "ops"}, "team"},
		{Client{Organisation: "gamma"}, "organisation"},
		{Client{Team: "ml", Organisation: "beta"}, "organisation"},
	} {
		c.cl.Name, c.cl.APIKeySHA256 = "late", []string{hashA}
		var fe *FieldError
		if err := cfg.CheckClient(&c.cl); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("team %q, organisation %q: %v, want an error about %s", c.cl.Team, c.cl.Organisation, err, c.field)
		}
	}
	late := &Client{Name: "late", APIKeySHA256: []string{hashA}, Team: "ml"}
	if err := cfg.CheckClient(late); err != nil {
		t.Fatal(err)
	}
	n, err := cfg.WithClients([]*Client{late})
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := n.ClientByName("late")
	var keys []string
	for _, a := range n.LevelsFor(cl, nil) {
		keys = append(keys, a.Key+" "+a.PolicyName)
	}
	if got := strings.Join(keys, ", "); got != "team:ml team-tpm, org:acme org-rpm" {
		t.Errorf("a runtime client of team ml is charged %q, want team-tpm under team:ml and org-rpm under org:acme", got)
	}
}
