package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// Costs known after the response, end to end: `sluice serve` in front of a real upstream that
// reports what each request used in a header (X-Usage-Tokens), on the memory store and on real
// Redis. The client's balance, read back from the store (POST /v1/check with cost 0, and on Redis
// the state's own string), follows the real costs exactly; a 5xx is refunded; a login route counts
// only its 401s.

const settleKey = "e2e-settle-partner-key-41d2"

// usageUpstream answers /v1/chat?tokens=N with the header X-Usage-Tokens: N (absent if tokens is
// absent, as written if it is not a number), /v1/chat?status=S with S and no header, and /login
// with 200 if ok=1, else 401.
func usageUpstream(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case strings.HasPrefix(r.URL.Path, "/login"):
			if q.Get("ok") != "1" {
				w.WriteHeader(http.StatusUnauthorized)
			}
		case q.Has("status"):
			s, _ := strconv.Atoi(q.Get("status"))
			w.WriteHeader(s)
		case q.Has("tokens"):
			w.Header().Set("X-Usage-Tokens", q.Get("tokens"))
		}
		fmt.Fprintln(w, "the model says hello")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// settleConfig: partner may use 10,000 model tokens per 1,000 hours (a fixed window that no test
// run straddles the edge of, so that the balance is exact); each chat request is charged an
// estimate of 1,000 up front, settled with the header's count, and refunded on a 5xx. /login
// takes 5 failed attempts in 15 minutes (a sliding log), successful ones costing nothing.
func settleConfig(upstreamURL, store string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
%s
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tokens, algorithm: fixed-window, limit: 10000, period: 1000h}
  - {name: logins, algorithm: sliding-log, limit: 5, period: 15m}
clients:
  - {name: partner, api_key_sha256: %q, policy: tokens}
routes:
  - path_prefix: /v1/chat
    cost: 1000
    cost_from: {header: X-Usage-Tokens}
    refund_on: [5xx]
  - path_prefix: /login
    policy: logins
    count_only: {status: [401]}
`, listen, admin, upstreamURL, store, sha256Hex(settleKey))
	}
}

// balance is the partner's remaining quota under policy, as the store holds it now (a peek).
func balance(t *testing.T, p *sluiceProc, policy string) int64 {
	t.Helper()
	return balanceOf(t, p, "partner", policy)
}

// balanceOf is client's remaining quota under policy, as the store holds it now: POST /v1/check
// with cost 0.
func balanceOf(t *testing.T, p *sluiceProc, client, policy string) int64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.admin+"/v1/check", bytes.NewBufferString(fmt.Sprintf(`{"client":%q,"policy":%q,"cost":0}`, client, policy)))
	resp, err := e2eClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Decisions []struct {
			Remaining int64 `json:"remaining"`
		} `json:"decisions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Decisions) != 1 {
		t.Fatalf("/v1/check: %v %+v", err, out)
	}
	return out.Decisions[0].Remaining
}

func TestServeE2ESettle(t *testing.T) {
	t.Parallel()
	for _, storeName := range []string{"memory", "redis"} {
		t.Run(storeName, func(t *testing.T) {
			t.Parallel()
			up := usageUpstream(t)
			storeYAML := "store: {type: memory}"
			var rs *redistest.Server
			if storeName == "redis" {
				rs = redistest.Start(t)
				storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 1s}", rs.Addr)
			}
			p := startSluice(t, t.TempDir(), "sluice.yaml", settleConfig(up.URL, storeYAML))
			// count is the tokens the store counts: on Redis, read from the state string itself.
			count := func() int64 {
				if rs == nil {
					return -1
				}
				return windowCount(t, rs, "rate-limit:{partner}:tokens:v2")
			}

			t.Run("usage header", func(t *testing.T) {
				used := int64(0)
				for i, s := range []struct {
					query    string
					status   int
					real     int64 // what the request costs in the end
					outcome  string
					refused  bool
					inFlight int64 // RateLimit remaining on the response: after the estimate
				}{
					{query: "tokens=250", status: 200, real: 250, inFlight: 9000},
					{query: "tokens=1000", status: 200, real: 1000, inFlight: 8750},
					{query: "tokens=4000", status: 200, real: 4000, inFlight: 7750},         // 3,000 more than estimated
					{query: "status=503", status: 503, real: 0, inFlight: 3750},             // refunded
					{query: "status=502", status: 502, real: 0, inFlight: 3750},             // refunded
					{query: "status=404", status: 404, real: 1000, inFlight: 3750},          // not 5xx, no header: the estimate
					{query: "tokens=12x", status: 200, real: 1000, inFlight: 2750},          // garbled: the estimate
					{query: "tokens=0", status: 200, real: 0, inFlight: 1750},               // all of it back
					{query: "tokens=9000", status: 200, real: 9000, inFlight: 1750},         // beyond the limit: 16,250 of 10,000
					{query: "tokens=1", refused: true, status: 429, real: 0, inFlight: 0},   // in debt: refused
					{query: "status=500", refused: true, status: 429, real: 0, inFlight: 0}, // still
				} {
					r := get(t, p.proxy, "/v1/chat?"+s.query, "X-API-Key", settleKey)
					if r.status != s.status {
						t.Fatalf("step %d %s: status %d, want %d: %s", i, s.query, r.status, s.status, r.body)
					}
					if !s.refused {
						rl, err := parseRateLimitField(r.header, "RateLimit", "r", "t")
						if err != nil || len(rl) != 1 || rl[0].name != "tokens" {
							t.Fatalf("step %d: RateLimit %v %v", i, rl, err)
						}
						if got := rl[0].params["r"]; got != s.inFlight {
							t.Fatalf("step %d %s: RateLimit r=%d on the response, want %d (after the estimate's charge)", i, s.query, got, s.inFlight)
						}
					}
					used += s.real
					want := max(0, 10000-used)
					if got := balance(t, p, "tokens"); got != want {
						t.Fatalf("step %d %s: balance %d, want %d (used %d)", i, s.query, got, want, used)
					}
					if rs != nil {
						if got := count(); got != used {
							t.Fatalf("step %d %s: Redis counts %d tokens, want %d", i, s.query, got, used)
						}
					}
				}
				if got := p.metric(t, "sluice_settlements_total", map[string]string{"client": "partner", "outcome": "garbled"}); got != 2 {
					t.Errorf("settlements garbled: %v, want 2 (the 404 without a header, the 12x)", got)
				}
				if got := p.metric(t, "sluice_settlements_total", map[string]string{"client": "partner", "outcome": "settled"}); got != 6 {
					t.Errorf("settlements settled: %v, want 6 (the 250, 4000, 503, 502, 0 and 9000)", got)
				}
			})

			t.Run("login counts only 401s", func(t *testing.T) {
				for i := range 3 { // successful logins cost nothing
					if r := get(t, p.proxy, "/login?ok=1", "X-API-Key", settleKey); r.status != 200 {
						t.Fatalf("login %d: %d", i, r.status)
					}
					if got := balance(t, p, "logins"); got != 5 {
						t.Fatalf("after %d successful logins: %d left, want 5", i+1, got)
					}
				}
				for i := range 5 {
					if r := get(t, p.proxy, "/login", "X-API-Key", settleKey); r.status != 401 {
						t.Fatalf("failed login %d: %d, want the upstream's 401", i, r.status)
					}
					if got := balance(t, p, "logins"); got != int64(4-i) {
						t.Fatalf("after %d failed logins: %d left, want %d", i+1, got, 4-i)
					}
				}
				if rs != nil {
					if n := mustLen(t, rs, "rate-limit:{partner}:logins:log"); n != 6 { // the header and 5 entries
						t.Fatalf("Redis holds %d elements of the login log, want 6 (a header, the 5 failures)", n)
					}
				}
				// Locked out: even the right password is refused now, and it costs nothing.
				r := get(t, p.proxy, "/login?ok=1", "X-API-Key", settleKey)
				if err := checkQuotaExceeded(r, "logins", "partner", 5, 900); err != nil {
					t.Fatalf("the 6th attempt: %v", err)
				}
				if got := balance(t, p, "logins"); got != 0 {
					t.Fatalf("after the lockout: %d left", got)
				}
			})
		})
	}
}

// windowCount is what the fixed window whose state is key on rs counts now.
func windowCount(t *testing.T, rs *redistest.Server, key string) int64 {
	t.Helper()
	v, err := rs.Do("GET", key)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(v) // "alg limit period window count"
	if len(f) != 5 {
		t.Fatalf("Redis %s = %q: not a fixed window's state", key, v)
	}
	n, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil {
		t.Fatalf("Redis %s = %q: %v", key, v, err)
	}
	return n
}

// mustLen is LLEN of key on rs.
func mustLen(t *testing.T, rs *redistest.Server, key string) int64 {
	t.Helper()
	v, err := rs.Do("LLEN", key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
