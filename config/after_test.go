package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The routes' after-response fields: cost_from, count_only, refund_on.

const afterPolicies = "policies:\n  - {name: p, algorithm: fixed-window, limit: 5, period: 15m}\n"

func TestAfterFields(t *testing.T) {
	cfg, err := parseTest(t, up+afterPolicies+`routes:
  - path_prefix: /v1/chat
    cost: 1000
    cost_from: {header: x-usage-tokens}
    refund_on: [5xx, 429]
  - path_prefix: /login
    count_only: {status: [401, 403]}
  - path_prefix: /plain
`)
	if err != nil {
		t.Fatal(err)
	}
	chat, login, plain := cfg.Routes[0].After, cfg.Routes[1].After, cfg.Routes[2].After
	if chat == nil || chat.CostFrom != "X-Usage-Tokens" || chat.CountOnly != nil ||
		!reflect.DeepEqual(chat.RefundOn, []StatusMatch{{Class: 5}, {Code: 429}}) || chat.Line != 7 {
		t.Errorf("cost_from route: %+v", chat)
	}
	if login == nil || !reflect.DeepEqual(login.CountOnly, []int{401, 403}) || login.CostFrom != "" || login.RefundOn != nil {
		t.Errorf("count_only route: %+v", login)
	}
	if plain != nil {
		t.Errorf("a route without the fields: %+v, want nil", plain)
	}
	for _, c := range []struct {
		status  int
		failed  bool
		counts  bool
		refunds bool
	}{{200, false, false, false}, {401, false, true, false}, {403, false, true, false}, {500, false, false, false}} {
		if got := login.Counts(c.status); got != c.counts {
			t.Errorf("count_only [401, 403] counts %d: %v", c.status, got)
		}
	}
	for _, c := range []struct {
		status  int
		failed  bool
		refunds bool
	}{{200, false, false}, {429, false, true}, {500, false, true}, {503, false, true}, {404, false, false}, {0, true, true}} {
		if got := chat.Refunds(c.status, c.failed); got != c.refunds {
			t.Errorf("refund_on [5xx, 429] refunds %d (failed %v): %v", c.status, c.failed, got)
		}
	}
}

func TestAfterErrors(t *testing.T) {
	route := up + afterPolicies + "routes:\n  - path_prefix: /x\n"
	for _, c := range []struct {
		name, yaml string
		want       []wantErr
	}{
		{"cost_from without header", route + "    cost_from: {}\n", []wantErr{at(6, `routes[0] "/x": cost_from: header is required`)}},
		{"cost_from not a mapping", route + "    cost_from: X-Usage\n", []wantErr{at(6, "cost_from must be a mapping")}},
		{"cost_from unknown field", route + "    cost_from: {header: X-U, heder: y}\n", []wantErr{at(6, `unknown field "heder"`)}},
		{"cost_from bad header", route + "    cost_from: {header: \"a b\"}\n", []wantErr{at(6, `cost_from.header "a b" is not a header name`)}},
		{"count_only without status", route + "    count_only: {}\n", []wantErr{at(6, "count_only: status is required")}},
		{"count_only empty", route + "    count_only: {status: []}\n", []wantErr{at(6, "count_only.status is empty")}},
		{"count_only bad status", route + "    count_only: {status: [401, 99, abc]}\n",
			[]wantErr{at(6, "count_only.status[1] 99 is not an HTTP status"), at(6, `count_only.status[2] "abc" must be an integer`)}},
		{"count_only status not a list", route + "    count_only: {status: 401}\n", []wantErr{at(6, "count_only.status must be a list")}},
		{"count_only with cost 0", route + "    cost: 0\n    count_only: {status: [401]}\n", []wantErr{at(7, "count_only needs a cost ≥ 1")}},
		{"refund_on not a list", route + "    refund_on: 5xx\n", []wantErr{at(6, "refund_on must be a list")}},
		{"refund_on empty", route + "    refund_on: []\n", []wantErr{at(6, "refund_on is empty")}},
		{"refund_on bad entries", route + "    refund_on: [6xx, 700, 5x, {a: 1}]\n",
			[]wantErr{at(6, `refund_on[0] "6xx" is not a status`), at(6, `refund_on[1] "700" is not a status`),
				at(6, `refund_on[2] "5x" is not a status`), at(6, "refund_on[3] must be a status")}},
		{"with forward_auth", route + "    count_only: {status: [401]}\nforward_auth: {refused_status: 429}\n",
			[]wantErr{at(6, `routes[0] "/x": count_only needs the upstream's response, which forward-auth never sees (forward_auth is configured at line 7)`)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseTest(t, c.yaml)
			var errs Errors
			if !errors.As(err, &errs) || cfg != nil {
				t.Fatalf("%v, %v: want Errors", cfg, err)
			}
			if len(errs) != len(c.want) {
				t.Fatalf("%d errors, want %d:\n%v", len(errs), len(c.want), err)
			}
			for i, w := range c.want {
				if errs[i].Line != w.line {
					t.Errorf("error %d at line %d, want %d: %v", i, errs[i].Line, w.line, errs[i])
				}
				for _, word := range w.words {
					if !strings.Contains(errs[i].Error(), word) {
						t.Errorf("error %d %q lacks %q", i, errs[i], word)
					}
				}
			}
		})
	}
}
