package answer

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
)

// problemBody is what a client decodes: every member RFC 9457 and sluice define, and nothing else.
type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	Instance         string   `json:"instance"`
	ViolatedPolicies []string `json:"violated-policies"`
	Client           string   `json:"client"`
	RetryAfter       int64    `json:"retry-after"`
}

// decodeProblem parses a problem body strictly: valid JSON, one object, no unknown members, and
// each member of the JSON type RFC 9457 gives it.
func decodeProblem(t testing.TB, body []byte) (problemBody, map[string]json.RawMessage) {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("body is not JSON: %s", body)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var p problemBody
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("body does not decode as a problem: %v: %s", err, body)
	}
	if dec.More() {
		t.Fatalf("trailing data after the problem: %s", body)
	}
	return p, raw
}

func members(raw map[string]json.RawMessage) []string {
	var out []string
	for k := range raw {
		out = append(out, k)
	}
	return sortStrings(out)
}

func sortStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}

func TestQuotaExceeded(t *testing.T) {
	tests := []struct {
		name      string
		client    string
		decisions []Applied
		want      problemBody
	}{
		{
			name:   "one policy",
			client: "partner-a",
			decisions: []Applied{{sluice.Policy{Name: "standard", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute},
				sluice.Decision{Limit: 100, RetryAfter: 11*time.Second + 300*time.Millisecond}, "", ""}},
			want: problemBody{
				Type: TypeQuotaExceeded, Title: "Quota Exceeded", Status: 429,
				Detail:           `client "partner-a" exceeded policy "standard" (100 requests per 1m); retry after 12 s (the same request sent sooner is refused too)`,
				ViolatedPolicies: []string{"standard"}, Client: "partner-a", RetryAfter: 12,
			},
		},
		{
			name:   "two of three policies",
			client: "partner-b",
			decisions: []Applied{
				{perSecond, sluice.Decision{Limit: 10, RetryAfter: 100 * time.Millisecond}, "", ""},
				{standard, sluice.Decision{Allowed: true, Limit: 20, Remaining: 5}, "", ""},
				{daily, sluice.Decision{Limit: 10000, RetryAfter: 3599*time.Second + 1}, "", ""},
			},
			want: problemBody{
				Type: TypeQuotaExceeded, Title: "Quota Exceeded", Status: 429,
				Detail:           `client "partner-b" exceeded policies "per-second" (10 requests per 1s) and "daily" (10000 requests per 24h); retry after 3600 s (the same request sent sooner is refused too)`,
				ViolatedPolicies: []string{"per-second", "daily"}, Client: "partner-b", RetryAfter: 3600,
			},
		},
		{
			name:      "anonymous, token bucket with a burst",
			decisions: []Applied{{standard, sluice.Decision{Limit: 20, RetryAfter: 600 * time.Millisecond}, "", ""}},
			want: problemBody{
				Type: TypeQuotaExceeded, Title: "Quota Exceeded", Status: 429,
				Detail:           `this anonymous client (counted by its network address) exceeded policy "standard" (100 requests per 1m, at most 20 at once); retry after 1 s (the same request sent sooner is refused too)`,
				ViolatedPolicies: []string{"standard"}, RetryAfter: 1,
			},
		},
		{
			name:   "leaky bucket, three policies refused",
			client: "c",
			decisions: []Applied{
				{sluice.Policy{Name: "queue", Algorithm: sluice.LeakyBucket, Limit: 1, Period: 90 * time.Minute, Burst: 2}, sluice.Decision{RetryAfter: time.Second}, "", ""},
				{sluice.Policy{Name: "q0", Algorithm: sluice.LeakyBucket, Limit: 5, Period: time.Second}, sluice.Decision{RetryAfter: time.Second}, "", ""},
				{perSecond, sluice.Decision{RetryAfter: 2 * time.Second}, "", ""},
			},
			want: problemBody{
				Type: TypeQuotaExceeded, Title: "Quota Exceeded", Status: 429,
				Detail:           `client "c" exceeded policies "queue" (1 request per 1h30m, evenly spaced, with room for 2 waiting), "q0" (5 requests per 1s, evenly spaced, none waiting) and "per-second" (10 requests per 1s); retry after 2 s (the same request sent sooner is refused too)`,
				ViolatedPolicies: []string{"queue", "q0", "per-second"}, Client: "c", RetryAfter: 2,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := QuotaExceeded(tt.client, tt.decisions)
			rec := httptest.NewRecorder()
			WriteProblem(rec, p)
			res := rec.Result()
			checkProblemResponse(t, res, tt.want)
		})
	}
}

// checkProblemResponse checks a problem response as a client would read it.
func checkProblemResponse(t *testing.T, res *http.Response, want problemBody) {
	t.Helper()
	if res.StatusCode != want.Status {
		t.Errorf("status %d, want %d", res.StatusCode, want.Status)
	}
	mt, _, err := mime.ParseMediaType(res.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", res.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if cl := res.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %s, body %d bytes", cl, len(body))
	}
	got, raw := decodeProblem(t, body)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problem\n got %+v\nwant %+v", got, want)
	}
	var wantMembers []string
	for _, m := range []struct {
		name    string
		present bool
	}{
		{"type", true}, {"title", want.Title != ""}, {"status", want.Status != 0}, {"detail", want.Detail != ""},
		{"instance", want.Instance != ""}, {"violated-policies", want.ViolatedPolicies != nil},
		{"client", want.Client != ""}, {"retry-after", want.RetryAfter != 0},
	} {
		if m.present {
			wantMembers = append(wantMembers, m.name)
		}
	}
	if got := members(raw); !reflect.DeepEqual(got, sortStrings(wantMembers)) {
		t.Errorf("members %v, want %v", got, wantMembers)
	}
	ra := res.Header.Get("Retry-After")
	switch {
	case want.RetryAfter == 0 && ra != "":
		t.Errorf("Retry-After %q, want none", ra)
	case want.RetryAfter != 0 && (!delaySeconds.MatchString(ra) || ra != strconv.FormatInt(want.RetryAfter, 10)):
		t.Errorf("Retry-After %q, want delay-seconds %d, as in the body", ra, want.RetryAfter)
	}
}

func TestOtherProblems(t *testing.T) {
	tests := []struct {
		name string
		p    Problem
		want problemBody
	}{
		{
			name: "store unavailable",
			p:    StoreUnavailable("partner-a", 4500*time.Millisecond),
			want: problemBody{
				Type: TypeStoreUnavailable, Title: "Rate Limiter Unavailable", Status: 503,
				Detail: `the rate limiter cannot reach its store, and this gateway does not forward requests it cannot count (fail-closed); the request from client "partner-a" was not forwarded and used no quota; retry after 5 s`,
				Client: "partner-a", RetryAfter: 5,
			},
		},
		{
			name: "store unavailable, anonymous, no retry time known",
			p:    StoreUnavailable("", 0),
			want: problemBody{
				Type: TypeStoreUnavailable, Title: "Rate Limiter Unavailable", Status: 503,
				Detail:     `the rate limiter cannot reach its store, and this gateway does not forward requests it cannot count (fail-closed); the request from this anonymous client (counted by its network address) was not forwarded and used no quota; retry after 1 s`,
				RetryAfter: 1,
			},
		},
		{
			name: "temporary reduced capacity (load shedding)",
			p:    ReducedCapacity("partner-a", 1500*time.Millisecond),
			want: problemBody{
				Type: TypeTemporaryReducedCapacity, Title: "Temporary Reduced Capacity", Status: 503,
				Detail: `the API is slower than usual and this gateway limits the requests in flight to it; the request from client "partner-a" was not forwarded (not a quota refusal: the client did nothing wrong); retry after 2 s`,
				Client: "partner-a", RetryAfter: 2,
			},
		},
		{
			name: "cost exceeds limit",
			p:    CostExceedsLimit("partner-a", Applied{standard, sluice.Decision{Limit: 20, Remaining: 20, RetryAfter: sluice.Never}, "", ""}, 25),
			want: problemBody{
				Type: TypeCostExceedsLimit, Title: "Request Cost Exceeds Quota", Status: 400,
				Detail:           `this request counts as 25 requests, but policy "standard" (100 requests per 1m, at most 20 at once) never lets client "partner-a" make more than 20 at once, so it can never be approved and retrying will not help; ask the API's operator for a larger quota`,
				ViolatedPolicies: []string{"standard"}, Client: "partner-a",
			},
		},
		{
			name: "bad request",
			p:    BadRequest(`cost "-1" must be a positive integer`),
			want: problemBody{Type: "about:blank", Title: "Bad Request", Status: 400, Detail: `cost "-1" must be a positive integer`},
		},
		{
			name: "zero problem",
			p:    Problem{},
			want: problemBody{Type: "about:blank", Status: 500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteProblem(rec, tt.p)
			res := rec.Result()
			if tt.p.Status == 0 {
				// The body says what the zero Problem says; only the status line defaults.
				if res.StatusCode != 500 {
					t.Errorf("status %d, want 500", res.StatusCode)
				}
				body, _ := io.ReadAll(res.Body)
				if got, _ := decodeProblem(t, body); !reflect.DeepEqual(got, problemBody{Type: "about:blank"}) {
					t.Errorf("zero problem body %+v", got)
				}
				return
			}
			checkProblemResponse(t, res, tt.want)
		})
	}
}

// TestRefusalOverHTTP serves a whole refusal, as the gateway will, and reads it back over a real
// connection: status, Retry-After, both Structured Fields, and the problem body.
func TestRefusalOverHTTP(t *testing.T) {
	decisions := []Applied{
		{perSecond, sluice.Decision{Limit: 10, RetryAfter: 1700 * time.Millisecond, ResetAfter: 2 * time.Second}, "", ""},
		{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 17, ResetAfter: 5 * time.Hour}, "", ""},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Headers(w.Header(), decisions, true)
		WriteProblem(w, QuotaExceeded("partner-a", decisions))
	}))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d", res.StatusCode)
	}
	if got := res.Header.Values("Retry-After"); len(got) != 1 || got[0] != "2" {
		t.Errorf("Retry-After %q, want one field of 2", got)
	}
	if got, want := parseList(t, res.Header.Values("RateLimit-Policy")), []member{policyMember("per-second", 10, 1), policyMember("daily", 10000, 86400)}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit-Policy %v, want %v", got, want)
	}
	if got, want := parseList(t, res.Header.Values("RateLimit")), []member{limitMember("per-second", 0, 2)}; !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit %v, want %v", got, want)
	}
	if got := [3]string{res.Header.Get("X-RateLimit-Limit"), res.Header.Get("X-RateLimit-Remaining"), res.Header.Get("X-RateLimit-Reset")}; got != [3]string{"10", "0", "2"} {
		t.Errorf("X-RateLimit-Limit/Remaining/Reset = %q", got)
	}
	body, _ := io.ReadAll(res.Body)
	p, _ := decodeProblem(t, body)
	if p.Type != TypeQuotaExceeded || p.Status != 429 || p.RetryAfter != 2 || p.Client != "partner-a" || !reflect.DeepEqual(p.ViolatedPolicies, []string{"per-second"}) {
		t.Errorf("problem %+v", p)
	}
	if !strings.Contains(p.Detail, `"per-second"`) || !strings.Contains(p.Detail, "retry after 2 s") {
		t.Errorf("detail %q does not say which policy and when to retry", p.Detail)
	}
}

func TestProblemJSONEscaping(t *testing.T) {
	odd := "quote\" backslash\\ nl\n cr\r tab\t nul\x00 del\x7f <tag>&amp; é 日本 \u2028\u2029 bad\xff\xfe end"
	p := Problem{Type: TypeBlank, Title: odd, Status: 400, Detail: odd, Instance: odd, ViolatedPolicies: []string{odd, ""}, Client: odd, RetryAfter: 3}
	b := p.AppendJSON(nil)
	got, _ := decodeProblem(t, b)
	want := viaEncodingJSON(t, odd)
	if got.Title != want || got.Detail != want || got.Instance != want || got.Client != want || !reflect.DeepEqual(got.ViolatedPolicies, []string{want, ""}) {
		t.Errorf("round trip of %q: %+v", odd, got)
	}
	if bytes.ContainsAny(b, "\n\r\t\x00<>&") || !utf8.Valid(b) {
		t.Errorf("encoding has raw control bytes or invalid UTF-8: %q", b)
	}
	mj, err := json.Marshal(p)
	if err != nil || !bytes.Equal(mj, b) {
		t.Errorf("json.Marshal = %s, %v; want AppendJSON's %s", mj, err, b)
	}
}

// viaEncodingJSON is s as encoding/json carries it: each invalid UTF-8 byte becomes U+FFFD.
func viaEncodingJSON(t testing.TB, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func FuzzProblemJSON(f *testing.F) {
	for _, s := range []string{"partner-a", "\"\\\x00", "\xff", "\u2028", "é", "\x7f", "<&>", "\b\f\v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := Problem{Title: s, Detail: s, ViolatedPolicies: []string{s}, Client: s, Status: 429, RetryAfter: 1}.AppendJSON(nil)
		got, _ := decodeProblem(t, b)
		if want := viaEncodingJSON(t, s); got.Detail != want || got.Title != want || got.ViolatedPolicies[0] != want {
			t.Fatalf("%q came back as %q, want %q", s, got.Detail, want)
		}
		if want, _ := json.Marshal(s); !bytes.Contains(b, want) {
			t.Fatalf("%q: encoded differently from encoding/json (%s): %s", s, want, b)
		}
	})
}

func BenchmarkRefusal(b *testing.B) {
	ds := []Applied{
		{perSecond, sluice.Decision{Limit: 10, RetryAfter: 1700 * time.Millisecond, ResetAfter: 2 * time.Second}, "", ""},
		{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 17, ResetAfter: 5 * time.Hour}, "", ""},
	}
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		Headers(w.Header(), ds, false)
		WriteProblem(w, QuotaExceeded("partner-a", ds))
	}
}

// TestDollars: micro-dollars read as dollars, cents always shown, nothing rounded.
func TestDollars(t *testing.T) {
	for n, want := range map[int64]string{0: "$0.00", 50_000_000: "$50.00", 1050: "$0.00105", 2_234_567: "$2.234567", 10: "$0.00001", -1_500_000: "-$1.50"} {
		if got := Dollars(n); got != want {
			t.Errorf("Dollars(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestQuotaExceededLevels: a refusal by a policy of a level above the client names the level and
// the group ("team \"ml\" exceeded its policy …"), after the client's own, which reads as ever;
// violated-policies lists them all, and the LLM shapes carry the same sentence.
func TestQuotaExceededLevels(t *testing.T) {
	usd := sluice.Policy{Name: "team-usd-month", Algorithm: sluice.FixedWindow, Limit: 500_000_000, Calendar: sluice.Month, Location: time.UTC}
	tpm := sluice.Policy{Name: "key-tpm", Algorithm: sluice.FixedWindow, Limit: 1000, Period: time.Minute}
	org := sluice.Policy{Name: "org-rpm", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute}
	refused := sluice.Decision{Limit: 1, RetryAfter: 2 * time.Second}
	for _, c := range []struct {
		name   string
		ds     []Applied
		detail string
	}{
		{"team only", []Applied{{tpm, sluice.Decision{Allowed: true}, "tokens", ""}, {usd, refused, "micro-dollars", `team "ml"`}},
			`team "ml" exceeded its policy "team-usd-month" ($500.00 per month in UTC); retry after 2 s`},
		{"key and organisation", []Applied{{org, refused, "", `organisation "acme"`}, {tpm, refused, "tokens", ""}},
			`client "k1" exceeded policy "key-tpm" (1000 tokens per 1m), and organisation "acme" exceeded its policy "org-rpm" (10 requests per 1m); retry after 2 s`},
		{"key only, as ever", []Applied{{tpm, refused, "tokens", ""}},
			`client "k1" exceeded policy "key-tpm" (1000 tokens per 1m); retry after 2 s`},
	} {
		p := QuotaExceeded("k1", c.ds)
		if !strings.HasPrefix(p.Detail, c.detail) {
			t.Errorf("%s: detail %q, want it to start %q", c.name, p.Detail, c.detail)
		}
		if p.Client != "k1" || len(p.ViolatedPolicies) == 0 {
			t.Errorf("%s: client %q, violated %v", c.name, p.Client, p.ViolatedPolicies)
		}
		p.Shape = ShapeOpenAI
		var e struct{ Error struct{ Message string } }
		if err := json.Unmarshal(p.AppendJSON(nil), &e); err != nil || e.Error.Message != p.Detail {
			t.Errorf("%s: OpenAI's message %q (%v), want the detail", c.name, e.Error.Message, err)
		}
	}
}
