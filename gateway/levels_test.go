package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/llmtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/llm"
)

// levelsConfig: organisation acme has teams ml (keys ml-1..3, on the OpenAI route) and ops
// (ops-1, ops-2, on Anthropic's); every level has budgets in tokens and dollars that the test's
// demand exceeds: each key 1,500 tokens (ml-1 300), each team 3,000 tokens and $0.009, the organisation 5,000
// tokens and $0.016, all per 1,000 hours (fixed windows no run straddles).
const levelsConfig = `
upstream: UPSTREAM
STORE
identity: [api_key: {header: X-Api-Key}]
policies:
  - {name: key-tpm, algorithm: fixed-window, limit: 1500, period: 1000h}
  - {name: key-small, algorithm: fixed-window, limit: 300, period: 1000h}
  - {name: team-tpm, algorithm: fixed-window, limit: 3000, period: 1000h}
  - {name: team-usd, algorithm: fixed-window, limit: $0.009, period: 1000h, counts: usd}
  - {name: org-tpm, algorithm: fixed-window, limit: 5000, period: 1000h}
  - {name: org-usd, algorithm: fixed-window, limit: $0.016, period: 1000h, counts: usd}
organisations:
  - {name: acme, policy: [org-tpm, org-usd]}
teams:
  - {name: ml, organisation: acme, policy: [team-tpm, team-usd]}
  - {name: ops, organisation: acme, policy: [team-tpm, team-usd]}
clients:
CLIENTS
routes:
  - {path_prefix: /v1/chat/completions, usage: {format: openai}}
  - {path_prefix: /v1/messages, usage: {format: anthropic}}
models:
  - {name: m, price: {input: 1, output: 4}}
`

// levelKeys are the test's clients and their teams.
var levelKeys = []struct{ name, team, policy string }{{"ml-1", "ml", "key-small"}, {"ml-2", "ml", "key-tpm"}, {"ml-3", "ml", "key-tpm"}, {"ops-1", "ops", "key-tpm"}, {"ops-2", "ops", "key-tpm"}}

// levelsYAML is levelsConfig on store, its clients listed.
func levelsYAML(store string) string {
	var cl strings.Builder
	for _, k := range levelKeys {
		fmt.Fprintf(&cl, "  - {name: %s, api_key_sha256: %s, policy: [%s], team: %s}\n", k.name, sum("sk-"+k.name), k.policy, k.team)
	}
	return strings.NewReplacer("STORE", store, "CLIENTS", cl.String()).Replace(levelsConfig)
}

// spent reads what key has spent of policy from the store's state, exactly even beyond the limit
// (where a decision's Remaining stops at 0): a settlement takes the limit off, a peek reads what
// is left, and a settlement puts it back.
func spent(t *testing.T, st sluice.Store, key string, p sluice.Policy) int64 {
	t.Helper()
	ctx := context.Background()
	d, err := st.Decide(ctx, key, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining > 0 {
		return p.Limit - d.Remaining
	}
	s := st.(sluice.Settler)
	if err := s.Settle(ctx, key, p, sluice.SettleNow, p.Limit, 0); err != nil {
		t.Fatal(err)
	}
	if d, err = st.Decide(ctx, key, p, 0); err != nil || d.Remaining == 0 {
		t.Fatalf("%s of %s is more than twice its limit (%v)", key, p.Name, err)
	}
	if err := s.Settle(ctx, key, p, sluice.SettleNow, 0, p.Limit); err != nil {
		t.Fatal(err)
	}
	return 2*p.Limit - d.Remaining
}

// levelRefusal is what a 429's body says, in either LLM API's shape.
type levelRefusal struct {
	Message  string
	Type     string
	Violated []string `json:"violated_policies"`
}

// readRefusal decodes a refusal in the shape of the route at path: OpenAI's
// {"error":{"message","type":"rate_limit_exceeded","code"}} or Anthropic's
// {"type":"error","error":{"type":"rate_limit_error","message"}}.
func readRefusal(t *testing.T, path string, resp *http.Response, body []byte) levelRefusal {
	t.Helper()
	var e struct {
		Type  string
		Error struct {
			levelRefusal
			Code string
		}
	}
	err := json.Unmarshal(body, &e)
	openai := path == "/v1/chat/completions"
	switch {
	case err != nil || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Retry-After") == "":
		t.Errorf("refusal on %s: %v %s (%v); want JSON with Retry-After", path, resp.Header, body, err)
	case openai && (e.Error.Type != "rate_limit_exceeded" || e.Error.Code != "rate_limit_exceeded" || e.Type != ""):
		t.Errorf("refusal on %s: %s; want OpenAI's error shape", path, body)
	case !openai && (e.Type != "error" || e.Error.Type != "rate_limit_error"):
		t.Errorf("refusal on %s: %s; want Anthropic's error shape", path, body)
	}
	return e.Error.levelRefusal
}

// namedLevels matches each level a refusal names and its policies.
var namedLevels = regexp.MustCompile(`(client|team|organisation) "([a-z0-9-]+)" exceeded (?:its )?polic(?:y|ies) ((?:"[a-z-]+" \([^)]*\)(?:, | and )?)+)`)

// TestLevelsConcurrentBudgets: 100 streamed requests at once from five keys of two teams of one
// organisation, whose demand exceeds every level's tokens and dollars. Each request is charged
// its estimate at its key, its team and the organisation in one decision, and settled at every
// level to the usage its stream reported. Afterwards, read from the store: every level's count is
// exactly the sum of its admitted members' usage (nothing counted twice, nothing lost), and the
// admissions kept to the limit: Σ min(usage, estimate) ≤ limit over each level's admitted
// requests, so spend ≤ limit + Σ max(0, usage - estimate) (docs/design.md). Every refusal is in
// its route's shape (OpenAI's, Anthropic's) and names the levels that refused, the client's own
// as "client …", a group's with its name — the requester's team, never the other one.
func TestLevelsConcurrentBudgets(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		for _, store := range []string{"memory", "redis"} {
			t.Run(store, func(t *testing.T) { testLevelsConcurrentBudgets(t, engine, store) })
		}
	})
}

func testLevelsConcurrentBudgets(t *testing.T, engine, store string) {
	storeYAML := "store: {type: memory}"
	if store == "redis" {
		storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 5s, slow_timeout: 5s}", redistest.Start(t).Addr)
	}
	yaml := levelsYAML(storeYAML)
	h := llmtest.NewHandler()
	up := &upstream{Server: httptest.NewServer(h)}
	t.Cleanup(up.Close)
	fe, srv := start(t, engine, yaml, up)
	_, cfg := policyOf(t, yaml, up, "")
	weights := cfg.ModelFor("m").Price.Weights()
	type outcome struct {
		key, team, path string
		status          int
		tokens, usd     int64 // usage, as each level counts it
		estTok, estUSD  int64 // the estimate
		refusal         levelRefusal
		body            []byte
	}
	const n = 100
	out := make([]outcome, n)
	var wg sync.WaitGroup
	client := &http.Client{}
	for i := range n {
		k := levelKeys[i%len(levelKeys)]
		input, output := int64(2+(i%4)*5), int64(40+(i*37)%61)
		o := outcome{key: k.name, team: k.team, path: "/v1/chat/completions"}
		body := `{"model":"m","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
		if k.team == "ops" {
			o.path = "/v1/messages"
			body = `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
		}
		rt, _ := cfg.Route(http.MethodPost, o.path)
		lr, err := llm.ParseRequest([]byte(body), int(rt.Usage.MaxBody))
		if err != nil {
			t.Fatal(err)
		}
		est := llm.EstimateUsage(lr, rt.Usage.Estimate)
		use := llm.Usage{Input: input, Output: output, Total: input + output, Found: true}
		o.estTok, o.estUSD = llm.Cost(est, llm.CountTotal, llm.Weights{}), llm.Cost(est, llm.CountWeighted, weights)
		o.tokens, o.usd = llm.Cost(use, llm.CountTotal, llm.Weights{}), llm.Cost(use, llm.CountWeighted, weights)
		out[i] = o
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, fe.URL+o.path, strings.NewReader(body))
			req.Header.Set("X-Api-Key", "sk-"+o.key)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Test-Usage", fmt.Sprintf("input=%d,output=%d", input, output))
			req.Header.Set("X-Test-Events", "3")
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out[i].status, out[i].body = resp.StatusCode, b
			if resp.StatusCode == http.StatusTooManyRequests {
				out[i].refusal = readRefusal(t, o.path, resp, b)
			}
		})
	}
	wg.Wait()
	admitted, refused := 0, 0
	for _, o := range out {
		switch o.status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("%s: %d %s", o.key, o.status, o.body)
		}
	}
	if admitted == 0 || refused == 0 {
		t.Fatalf("%d admitted, %d refused: the demand should exceed the budgets, and fit some", admitted, refused)
	}
	t.Logf("%d admitted, %d refused", admitted, refused)
	waitFor(t, fmt.Sprintf("%d usage requests settled", admitted), func() bool {
		return counterSum(t, srv.Registry(), "sluice_llm_requests_total", nil) >= float64(admitted)
	})
	if got := h.Count(); got != admitted {
		t.Errorf("the upstream saw %d requests, want the %d admitted", got, admitted)
	}
	// Each level: its key in the store, its members, and its policies.
	type level struct {
		key      string
		member   func(o *outcome) bool
		policies []string
	}
	levels := []level{{"org:acme", func(*outcome) bool { return true }, []string{"org-tpm", "org-usd"}}}
	for _, team := range []string{"ml", "ops"} {
		levels = append(levels, level{"team:" + team, func(o *outcome) bool { return o.team == team }, []string{"team-tpm", "team-usd"}})
	}
	for _, k := range levelKeys {
		levels = append(levels, level{k.name, func(o *outcome) bool { return o.key == k.name }, []string{k.policy}})
	}
	for _, l := range levels {
		for _, name := range l.policies {
			p, _ := cfg.Policy(name)
			var sum, kept, over int64 // Σ usage, Σ min(usage, estimate), Σ max(0, usage - estimate)
			for i := range out {
				o := &out[i]
				if o.status != http.StatusOK || !l.member(o) {
					continue
				}
				use, est := o.tokens, o.estTok
				if strings.HasSuffix(name, "-usd") {
					use, est = o.usd, o.estUSD
				}
				sum, kept, over = sum+use, kept+min(use, est), over+max(0, use-est)
			}
			got := spent(t, srv.Store(), l.key, p)
			if got != sum {
				t.Errorf("%s %s: the store counts %d, its admitted members used %d", l.key, name, got, sum)
			}
			if kept > p.Limit || got > p.Limit+over {
				t.Errorf("%s %s: limit %d overrun: spent %d (Σ min(usage, estimate) %d, estimate errors %d)", l.key, name, p.Limit, got, kept, over)
			}
		}
	}
	// Refusals name the levels that refused, each with its own policies; a group is the
	// requester's.
	byLevel := map[string]int{}
	levelOf := map[string]string{"key-tpm": "client", "key-small": "client", "team-tpm": "team", "team-usd": "team", "org-tpm": "organisation", "org-usd": "organisation"}
	for _, o := range out {
		if o.status != http.StatusTooManyRequests {
			continue
		}
		named := namedLevels.FindAllStringSubmatch(o.refusal.Message, -1)
		if len(named) == 0 {
			t.Errorf("%s's refusal %q names no level", o.key, o.refusal.Message)
		}
		var policies []string
		for _, m := range named {
			byLevel[m[1]]++
			want := map[string]string{"client": o.key, "team": o.team, "organisation": "acme"}[m[1]]
			if m[2] != want {
				t.Errorf("%s's refusal %q names %s %q, want %q", o.key, o.refusal.Message, m[1], m[2], want)
			}
			for _, p := range regexp.MustCompile(`"([a-z-]+)" \(`).FindAllStringSubmatch(m[3], -1) {
				policies = append(policies, p[1])
				if levelOf[p[1]] != m[1] {
					t.Errorf("%s's refusal %q: policy %s named as the %s's", o.key, o.refusal.Message, p[1], m[1])
				}
			}
		}
		if slices.Sort(policies); !slices.Equal(policies, slices.Sorted(slices.Values(o.refusal.Violated))) {
			t.Errorf("%s's refusal: message names %v, violated_policies %v", o.key, policies, o.refusal.Violated)
		}
	}
	t.Logf("refusals by level: %v", byLevel)
	if byLevel["client"] == 0 || byLevel["team"]+byLevel["organisation"] == 0 {
		t.Error("no refusal by a key, or none by a team or the organisation: the budgets were never reached")
	}
}

// TestLevelsRequestsExact: an organisation's 10 requests per 1,000 hours, shared by two teams'
// four keys sending 40 requests at once, admit exactly 10, whichever keys sent them — on one Redis
// server, on a Redis Cluster (the organisation's counter in its own slot, decided across slots
// with each key's) and in memory. Every refusal is a problem+json naming the organisation.
func TestLevelsRequestsExact(t *testing.T) {
	for _, store := range []string{"memory", "redis", "cluster"} {
		t.Run(store, func(t *testing.T) {
			storeYAML := "store: {type: memory}"
			switch store {
			case "redis":
				storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 5s, slow_timeout: 5s}", redistest.Start(t).Addr)
			case "cluster":
				storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 5s, slow_timeout: 5s}", strings.Join(redistest.StartCluster(t, 3).Addrs(), ", "))
			}
			keys := []string{"a-1", "a-2", "b-1", "b-2"}
			yaml := `upstream: UPSTREAM
` + storeYAML + `
identity: [api_key: {header: X-Api-Key}]
policies:
  - {name: org-requests, algorithm: fixed-window, limit: 10, period: 1000h}
  - {name: team-requests, algorithm: fixed-window, limit: 1000, period: 1000h}
organisations: [{name: acme, policy: org-requests}]
teams:
  - {name: a, organisation: acme, policy: team-requests}
  - {name: b, organisation: acme, policy: team-requests}
clients:
`
			for _, k := range keys {
				yaml += fmt.Sprintf("  - {name: %s, api_key_sha256: %s, team: %s}\n", k, sum("sk-"+k), k[:1])
			}
			up := newUpstream(t)
			fe, srv := start(t, "fasthttp", yaml, up)
			statuses := make([]int, 40)
			type problem struct {
				Detail           string
				ViolatedPolicies []string `json:"violated-policies"`
				Client           string
			}
			bodies := make([]problem, 40)
			var wg sync.WaitGroup
			for i := range statuses {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodGet, fe.URL+"/orders", nil)
					req.Header.Set("X-Api-Key", "sk-"+keys[i%len(keys)])
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					statuses[i] = resp.StatusCode
					if resp.StatusCode == http.StatusTooManyRequests {
						if resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(b, &bodies[i]) != nil {
							t.Errorf("refusal %v %s: want problem+json", resp.Header, b)
						}
					}
				})
			}
			wg.Wait()
			admitted := 0
			for i, s := range statuses {
				switch s {
				case http.StatusOK:
					admitted++
				case http.StatusTooManyRequests:
					p := bodies[i]
					if !strings.HasPrefix(p.Detail, `organisation "acme" exceeded its policy "org-requests" (10 requests per 1000h)`) ||
						!slices.Equal(p.ViolatedPolicies, []string{"org-requests"}) || p.Client != keys[i%len(keys)] {
						t.Errorf("refusal of %s: %+v", keys[i%len(keys)], p)
					}
				default:
					t.Errorf("request %d: %d", i, s)
				}
			}
			if admitted != 10 || up.got("/orders") != 10 {
				t.Errorf("%d admitted, the upstream saw %d; want exactly the organisation's 10", admitted, up.got("/orders"))
			}
			p, _ := policyOf(t, yaml, up, "team-requests")
			if a, b := spent(t, srv.Store(), "team:a", p), spent(t, srv.Store(), "team:b", p); a+b != 10 {
				t.Errorf("teams a and b counted %d and %d requests, want 10 between them", a, b)
			}
		})
	}
}

// policyOf is the configured policy called name of yaml.
func policyOf(t *testing.T, yaml string, up *upstream, name string) (sluice.Policy, *config.Config) {
	t.Helper()
	cfg, err := config.Parse([]byte(strings.ReplaceAll(yaml, "UPSTREAM", up.URL)), "levels.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := cfg.Policy(name)
	return p, cfg
}
