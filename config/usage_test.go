package config

import (
	"testing"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/llm"
)

// llmUp is a valid start for a usage route's cases: lines 2 to 4 define a policy, so that the
// cases' own lines start at 5.
const llmUp = up + "policies:\n  - {name: tpm, algorithm: fixed-window, limit: 100000, period: 1m}\ndefault_policy: tpm\n"

func init() {
	errorCases = append(errorCases, []struct {
		name string
		yaml string
		want []wantErr
	}{
		{"usage: no format", llmUp + "routes:\n  - {path_prefix: /v1, usage: {count: total}}\n",
			[]wantErr{at(6, `routes[0] "/v1" usage`, "format is required")}},
		{"usage: bad format", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: gemini}}\n",
			[]wantErr{at(6, `format "gemini" is unknown`, "openai, anthropic or field")}},
		{"usage: bad count", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, count: prompt}}\n",
			[]wantErr{at(6, `count "prompt" is unknown`)}},
		{"usage: unknown field", llmUp + "routes:\n  - path_prefix: /v1\n    usage:\n      format: openai\n      cont: total\n",
			[]wantErr{at(9, `usage: unknown field "cont"`, `"count"`)}},
		{"usage: field without format field", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, field: usage.total}}\n",
			[]wantErr{at(6, "field is only for format: field")}},
		{"usage: format field without field", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: field}}\n",
			[]wantErr{at(6, "format: field needs field")}},
		{"usage: weighted without weights", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, count: weighted}}\n",
			[]wantErr{at(6, "count: weighted needs weights")}},
		{"usage: weights with count", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, count: output, weights: {output: 4}}}\n",
			[]wantErr{at(6, "weights are only for count: weighted")}},
		{"usage: bad weight", llmUp + "routes:\n  - path_prefix: /v1\n    usage:\n      format: openai\n      weights: {output: 0.0001}\n",
			[]wantErr{at(9, "weights.output", "at most 3 decimals")}},
		{"usage: estimate out of range", llmUp + "routes:\n  - path_prefix: /v1\n    usage:\n      format: openai\n      estimate: {bytes_per_token: 0}\n",
			[]wantErr{at(9, "estimate.bytes_per_token 0 must be in 1..")}},
		{"usage: estimate over the limit", llmUp + "routes:\n  - path_prefix: /v1\n    usage:\n      format: openai\n      estimate: {max: 200000}\n",
			[]wantErr{at(9, "usage.estimate.max 200000 is more than policy \"tpm\" ever allows at once (100000)")}},
		{"usage: max_body", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, max_body: 10}}\n",
			[]wantErr{at(6, "max_body 10 must be in 1024..")}},
		{"usage: inject_usage anthropic", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: anthropic, inject_usage: true}}\n",
			[]wantErr{at(6, "inject_usage is for format: openai")}},
		{"usage: no_usage", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, no_usage: free}}\n",
			[]wantErr{at(6, `no_usage "free" is unknown`)}},
		{"usage: errors", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai, errors: xml}}\n",
			[]wantErr{at(6, `errors "xml" is unknown`)}},
		{"usage: beside cost", llmUp + "routes:\n  - {path_prefix: /v1, cost: 5, usage: {format: openai}}\n",
			[]wantErr{at(6, "cost and usage exclude each other")}},
		{"usage: beside cost_from", llmUp + "routes:\n  - {path_prefix: /v1, cost_from: {header: X-T}, usage: {format: openai}}\n",
			[]wantErr{at(6, "cost_from and usage exclude each other")}},
		{"usage: forward_auth", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai}}\nforward_auth: {refused_status: 429}\n",
			[]wantErr{at(6, "usage needs the upstream's response, which forward-auth never sees")}},
		{"counts: unknown", up + "policies:\n  - {name: t, algorithm: fixed-window, limit: 1, period: 1m, counts: words}\n",
			[]wantErr{at(3, `counts "words" is unknown`)}},
		{"counts: concurrency", up + "policies:\n  - {name: t, algorithm: concurrency, limit: 1, counts: tokens}\n",
			[]wantErr{at(3, "counts: tokens is not for a concurrency policy")}},
		{"counts: usd limit not dollars", up + "policies:\n  - {name: t, algorithm: fixed-window, limit: 50, period: 24h, counts: usd}\n",
			[]wantErr{at(3, `limit "50" of a counts: usd policy must be dollars, e.g. $50`)}},
		{"counts: usd without prices", up + "policies:\n  - {name: t, algorithm: fixed-window, limit: $50, period: 24h, counts: usd}\n",
			[]wantErr{at(3, `policy "t" counts usd, but no model has a price`)}},
		{"counts: tokens on a plain route", up + "policies:\n  - {name: t, algorithm: fixed-window, limit: 9, period: 1m, counts: tokens}\nroutes:\n  - {path_prefix: /v1, policy: t}\n",
			[]wantErr{at(5, `policy "t" counts tokens, but this route has no usage`)}},
		{"models: no usage route", llmUp + "models:\n  - {name: gpt-4o, price: {input: 2.5, output: 10}}\n",
			[]wantErr{at(6, "models apply on usage routes, and no route has usage")}},
		{"models: bad name", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai}}\nmodels:\n  - {name: \"gpt 4o\"}\n",
			[]wantErr{at(8, `name "gpt 4o" must be 1..128 printable ASCII characters without spaces`)}},
		{"models: twice", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai}}\nmodels:\n  - {name: a}\n  - {name: a}\n",
			[]wantErr{at(9, `model "a" is already listed at line 8`)}},
		{"models: price without output", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai}}\nmodels:\n  - {name: a, price: {cached_input: 1}}\n",
			[]wantErr{at(8, "price needs input and output")}},
		{"models: unknown policy", llmUp + "routes:\n  - {path_prefix: /v1, usage: {format: openai}}\nmodels:\n  - {name: a, policy: [nope]}\n",
			[]wantErr{at(8, `policy "nope" is not defined`)}},
		{"key_by: json_body other", up + "policies:\n  - name: t\n    algorithm: fixed-window\n    limit: 1\n    period: 1m\n    key_by: [{json_body: messages}]\n",
			[]wantErr{at(7, `json_body "messages": only model is read`)}},
	}...)
}

// TestUsageParses: a complete LLM configuration reads as written, with its defaults.
func TestUsageParses(t *testing.T) {
	cfg, err := parseTest(t, up+`identity:
  - api_key: {header: Authorization}
policies:
  - {name: tpm, algorithm: sliding-window, limit: 200000, period: 1m}
  - {name: rpm, algorithm: sliding-window, limit: 500, period: 1m, counts: requests}
  - {name: daily, algorithm: fixed-window, limit: $50, period: 24h, counts: usd}
  - {name: streams, algorithm: concurrency, limit: 10, lease: 10m}
  - name: per-model
    algorithm: sliding-window
    limit: 300000
    period: 1m
    key_by: [client, {json_body: model}]
clients:
  - {name: team, api_key_sha256: `+hashA+`, policy: [tpm, rpm, daily, streams]}
routes:
  - path_prefix: /v1/chat/completions
    usage: {format: openai, inject_usage: true}
  - path_prefix: /v1/messages
    usage:
      format: anthropic
      weights: {input: 1, cached_input: 0.1, output: 4}
      estimate: {bytes_per_token: 3, default_output: 1000, max: 100000}
      no_usage: refund
      errors: problem
  - path_prefix: /v1/other
models:
  - {name: gpt-4o, price: {input: 2.50, cached_input: 1.25, output: 10}, policy: [per-model]}
  - {name: "*", price: {input: 1, output: 1}}
`)
	if err != nil {
		t.Fatal(err)
	}
	chat, msgs := cfg.Routes[0].Usage, cfg.Routes[1].Usage
	if chat.Format != llm.OpenAI || chat.Count != llm.CountTotal || !chat.InjectUsage || chat.Errors != answer.ShapeOpenAI ||
		chat.MaxBody != DefaultMaxBody || chat.Estimate.DefaultOutput != DefaultDefaultOutput || chat.Refund {
		t.Errorf("chat usage %+v", chat)
	}
	if msgs.Format != llm.Anthropic || msgs.Count != llm.CountWeighted || msgs.Weights != (llm.Weights{Input: 1000, CachedInput: 100, Output: 4000}) ||
		msgs.Estimate.BytesPerToken != 3 || msgs.Estimate.Max != 100000 || !msgs.Refund || msgs.Errors != answer.ShapeProblem {
		t.Errorf("messages usage %+v", msgs)
	}
	daily := cfg.policies["daily"]
	if daily.Limit != 50_000_000 || daily.Counts != UnitUSD {
		t.Errorf("daily: %+v, want 50,000,000 micro-dollars", daily)
	}
	units := func(rt *Route) map[string]Unit {
		cl, _ := cfg.ClientByName("team")
		out := map[string]Unit{}
		for _, a := range cfg.AppliedPoliciesFor(cl, rt) {
			out[a.PolicyName] = a.Unit
		}
		return out
	}
	if got := units(cfg.Routes[0]); len(got) != 4 || got["tpm"] != UnitTokens || got["rpm"] != UnitRequests || got["daily"] != UnitUSD || got["streams"] != UnitRequests {
		t.Errorf("on a usage route: %v", got)
	}
	// Tokens and money are not counted where there are none.
	if got := units(cfg.Routes[2]); len(got) != 3 || got["tpm"] != UnitRequests || got["rpm"] != UnitRequests || got["streams"] != UnitRequests {
		t.Errorf("on a plain route: %v, want tpm, rpm and streams, all counting requests (daily counts money: not here)", got)
	}
	m := cfg.ModelFor("gpt-4o")
	if m.Price.Weights() != (llm.Weights{Input: 2500, CachedInput: 1250, Output: 10000}) || len(m.Applied()) != 1 || m.Applied()[0].Policy.Name != "per-model@gpt-4o" {
		t.Errorf("gpt-4o: %+v %+v", m.Price, m.Applied())
	}
	if cfg.ModelFor("llama").Name != "*" {
		t.Error("an unlisted model should find *")
	}
}
