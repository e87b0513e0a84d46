package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
)

// The diagnosis, on a real gateway behind a trusted proxy (this test, from 127.0.0.1, saying
// each request's address in X-Forwarded-For): an anonymous flood from three addresses and an
// unknown API key shows them as the heaviest anonymous clients, by requests and by refusals,
// with the flooders as the worst immediate retriers; anonymous clients behind a proxy that is not
// trusted (counted as one) are flagged, and two partners named by their keys from one address are
// not; a partner refused at its limit that waits its Retry-After gets a suggested limit; and
// the memory store's separate counters are warned of. /v1/stats says it, and the operator page
// shows the same (Chromium).
func TestServeE2EDiagnosis(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.slow = 0
	hash := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	keyA, keyB, keySteady, unknown := "diag-key-a", "diag-key-b", "diag-key-steady", "diag-key-nobody-has"
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - api_key: {}
  - ip: {trusted_proxies: [127.0.0.1/32]}
policies:
  - {name: anon, algorithm: fixed-window, limit: 5, period: 24h}
  - {name: wide, algorithm: token-bucket, limit: 1000, period: 1s}
  - {name: tight, algorithm: fixed-window, limit: 5, period: 1s}
default_policy: anon
clients:
  - {name: shop-a, api_key_sha256: %s, policy: wide}
  - {name: shop-b, api_key_sha256: %s, policy: wide}
  - {name: steady, api_key_sha256: %s, policy: tight}
`, listen, admin, up.URL, hash(keyA), hash(keyB), hash(keySteady))
	})
	from := func(addr string, headers ...string) []string {
		return append([]string{"X-Forwarded-For", addr}, headers...)
	}

	// The flood: 60, 40 and 30 requests from three addresses (5 pass each), one from each of 20
	// others, and 12 with a key no client has, from one more.
	flood := map[string]int{"203.0.113.1": 60, "203.0.113.2": 40, "203.0.113.3": 30}
	for addr, n := range flood {
		for i := 0; i < n; i++ {
			get(t, p.proxy, "/orders", from(addr)...)
		}
	}
	for i := 0; i < 20; i++ {
		get(t, p.proxy, "/orders", from(fmt.Sprintf("198.51.100.%d", i+1))...)
	}
	for i := 0; i < 12; i++ {
		get(t, p.proxy, "/orders", from("192.0.2.99", "X-API-Key", unknown)...)
	}
	// Two partners from one address, named by their keys: counted apart, no mistake. Three
	// anonymous clients behind 192.0.2.50, a proxy that is not trusted: counted as one.
	for i := 0; i < 3; i++ {
		get(t, p.proxy, "/orders", from("192.0.2.51", "X-API-Key", keyA)...)
		get(t, p.proxy, "/orders", from("192.0.2.51", "X-API-Key", keyB)...)
		get(t, p.proxy, "/orders", from(fmt.Sprintf("198.51.100.20%d, 192.0.2.50", i))...)
	}
	// A partner that sends until refused, then waits the Retry-After it was given: refused at
	// its limit of 5 a second three times, never early. (The waiting is the behaviour under test.)
	for refusals := 0; refusals < 3; {
		r := get(t, p.proxy, "/orders", from("192.0.2.60", "X-API-Key", keySteady)...)
		if r.status == 429 {
			refusals++
			secs, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || secs < 1 {
				t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
			}
			time.Sleep(time.Duration(secs) * time.Second)
		}
	}

	resp, err := http.Get(p.admin + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st gateway.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := st.Diagnosis
	// Fewer keys than counters: every count is exact.
	want := []gateway.Hitter{{Key: "ip:203.0.113.1", Count: 60}, {Key: "ip:203.0.113.2", Count: 40}, {Key: "ip:203.0.113.3", Count: 30}, {Key: "ip:192.0.2.99", Count: 12}}
	wantRefused := []gateway.Hitter{{Key: "ip:203.0.113.1", Count: 55}, {Key: "ip:203.0.113.2", Count: 35}, {Key: "ip:203.0.113.3", Count: 25}, {Key: "ip:192.0.2.99", Count: 7}}
	if len(d.Addresses.Requests) < 5 || len(d.Addresses.Refusals) != 4 {
		t.Fatalf("addresses: %+v", d.Addresses)
	}
	for i := range want {
		if d.Addresses.Requests[i] != want[i] || d.Addresses.Refusals[i] != wantRefused[i] {
			t.Fatalf("heavy addresses: %+v, want %+v first; by refusals %+v, want %+v", d.Addresses.Requests, want, d.Addresses.Refusals, wantRefused)
		}
	}
	if d.Addresses.TotalRequests != 60+40+30+20+12+3 {
		t.Fatalf("anonymous requests counted: %d", d.Addresses.TotalRequests)
	}
	if k := d.UnknownKeys; len(k.Requests) != 1 || k.Requests[0] != (gateway.Hitter{Key: hash(unknown), Count: 12}) ||
		len(k.Refusals) != 1 || k.Refusals[0].Count != 7 {
		t.Fatalf("unknown keys: %+v", k)
	}
	if len(d.SharedAddress) != 1 || d.SharedAddress[0].Address != "192.0.2.50" ||
		fmt.Sprint(d.SharedAddress[0].Clients) != "[198.51.100.200 198.51.100.201 198.51.100.202]" {
		t.Fatalf("shared addresses: %+v", d.SharedAddress)
	}
	if len(d.LimitTooLow) != 1 {
		t.Fatalf("limits too low: %+v", d.LimitTooLow)
	}
	if l := d.LimitTooLow[0]; l.Client != "steady" || l.Policy != "tight" || l.Limit != 5 || l.Refused != 3 || l.PeakAllowed != 5 ||
		l.PeakDemand != 6 || l.SuggestedLimit != 6 {
		t.Fatalf("steady: %+v, want refused 3 at its limit of 5, a demand of 6 a second, and 6 suggested", l)
	}
	// The flooders retried at once: each refusal after its first came back early.
	if len(d.EarlyRetriers) < 3 || d.EarlyRetriers[0].Key != "ip:203.0.113.1" || d.EarlyRetriers[0].Count != 54 ||
		d.EarlyRetriers[0].RetryAfterMs <= 0 || d.EarlyRetriers[0].AfterMs >= d.EarlyRetriers[0].RetryAfterMs {
		t.Fatalf("early retriers: %+v", d.EarlyRetriers)
	}
	for _, r := range d.EarlyRetriers {
		if r.Key == "steady" {
			t.Fatalf("steady, which waits its Retry-After, is among the early retriers: %+v", r)
		}
	}
	kinds := map[string]string{}
	for _, f := range d.Findings {
		if f.Do == "" || f.Summary == "" {
			t.Fatalf("a finding without what to do: %+v", f)
		}
		if _, ok := kinds[f.Kind]; !ok {
			kinds[f.Kind] = f.Subject
		}
	}
	for kind, subject := range map[string]string{"separate_counters": "store: memory", "shared_address": "192.0.2.50", "limit_too_low": "steady",
		"heavy_hitter": "ip:203.0.113.1", "unknown_api_key": hash(unknown), "early_retries": "ip:203.0.113.1"} {
		if kinds[kind] != subject {
			t.Fatalf("finding %s: %q, want %q; findings: %+v", kind, kinds[kind], subject, d.Findings)
		}
	}

	for _, size := range []struct {
		name          string
		width, height int
	}{{"diagnosis-desktop", 1280, 1600}, {"diagnosis-phone", 390, 2400}} {
		tab := browsertest.NewTab(t, size.width, size.height)
		tab.Do("open the operator page", chromedp.Navigate(p.admin+"/operator/"))
		tab.Wait("the flood's addresses as the heaviest anonymous clients",
			`[...document.querySelectorAll('#diag-addresses tbody tr')].slice(0, 3).map(tr => tr.dataset.key).join() === "ip:203.0.113.1,ip:203.0.113.2,ip:203.0.113.3"`)
		if got := browsertest.Eval[[]string](tab, `[...document.querySelector('#diag-addresses tr[data-key="ip:203.0.113.1"]').cells].map(c => c.textContent)`); fmt.Sprint(got) != "[ip:203.0.113.1 60 0 55]" {
			t.Fatalf("the heaviest address on the page: %q", got)
		}
		if got := browsertest.Eval[string](tab, `document.querySelector('#diag-keys tbody tr').dataset.key`); got != hash(unknown) {
			t.Fatalf("the unknown key on the page: %q", got)
		}
		if got := browsertest.Eval[string](tab, `document.querySelector('#diag-shared tr[data-key="192.0.2.50"] td').textContent`); got != "198.51.100.200, 198.51.100.201, 198.51.100.202" {
			t.Fatalf("the shared address on the page: %q", got)
		}
		if got := browsertest.Eval[string](tab, `document.querySelector('#diag-low tr[data-key="steady"] td.suggested').textContent`); got != "6" {
			t.Fatalf("steady's suggested limit on the page: %q", got)
		}
		if got := browsertest.Eval[string](tab, `document.querySelector('#diag-retries tbody tr').dataset.key`); got != "ip:203.0.113.1" {
			t.Fatalf("the worst early retrier on the page: %q", got)
		}
		got := browsertest.Eval[[]string](tab, `[...document.querySelectorAll('#findings li')].map(li => li.dataset.kind + " " + li.dataset.subject)`)
		for _, w := range []string{"separate_counters store: memory", "shared_address 192.0.2.50", "limit_too_low steady", "heavy_hitter ip:203.0.113.1"} {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				t.Fatalf("findings on the page: %q, want %q among them", got, w)
			}
		}
		if !browsertest.Eval[bool](tab, `[...document.querySelectorAll('#findings li .todo')].every(s => s.textContent.startsWith("What to do: "))`) {
			t.Fatal("a finding on the page without what to do")
		}
		tab.Screenshot(size.name)
	}
}
