package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
)

// The operator page, on a real gateway with traffic from two clients, one of them over its limit:
// the page shows that client as limited, and the other as not. The stats endpoint it reads says
// the same. Screenshots go to artifacts/.
//
// "Limited" lasts 10 s after a refusal, or until its Retry-After ends: the limited client's
// policy is a token bucket of 3 an hour, whose refusal says to retry in 20 minutes wherever in
// the hour the test runs (a fixed window's would end at the hour, and the badge 10 s after the
// traffic: a browser that starts slowly on a busy machine would miss it).
func TestServeE2EOperatorPage(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.slow = 0
	keyA, keyB := "operator-e2e-key-a", "operator-e2e-key-b"
	hash := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: small, algorithm: token-bucket, limit: 3, period: 1h}
  - {name: large, algorithm: token-bucket, limit: 1000, period: 1s}
clients:
  - {name: partner-over, api_key_sha256: %s, policy: small}
  - {name: partner-fine, api_key_sha256: %s, policy: large}
`, listen, admin, up.URL, hash(keyA), hash(keyB))
	})
	for i := 0; i < 10; i++ {
		get(t, p.proxy, "/orders", "X-API-Key", keyA) // 3 pass, 7 refused
		if r := get(t, p.proxy, "/orders", "X-API-Key", keyB); r.status != 200 {
			t.Fatalf("partner-fine request %d: %d", i, r.status)
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
	byName := map[string]gateway.ClientStats{}
	for _, c := range st.Clients {
		byName[c.Client] = c
	}
	over, fine := byName["partner-over"], byName["partner-fine"]
	if !over.Limited || over.Allowed != 3 || over.Refused != 7 || over.EarlyRetries != 6 {
		t.Fatalf("partner-over: %+v, want limited, 3 allowed, 7 refused, 6 early retries", over)
	}
	if fine.Limited || fine.Allowed != 10 || fine.Refused != 0 {
		t.Fatalf("partner-fine: %+v, want not limited, 10 allowed", fine)
	}
	if !st.Store.Reachable || st.Store.Type != "memory" || st.Store.BreakerOpen {
		t.Fatalf("store: %+v", st.Store)
	}

	// The admin listener's root is the browser simulation, served whole.
	for _, path := range []string{"/", "/sluice.wasm"} {
		r, err := http.Get(p.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 200 || r.Header.Get("Content-Type") != web.ContentType(strings.TrimPrefix(path, "/")) && path != "/" {
			t.Fatalf("admin %s: %d %q", path, r.StatusCode, r.Header.Get("Content-Type"))
		}
	}

	for _, size := range []struct {
		name          string
		width, height int
	}{{"operator-desktop", 1280, 800}, {"operator-phone", 390, 844}} {
		tab := browsertest.NewTab(t, size.width, size.height)
		tab.Do("open the operator page", chromedp.Navigate(p.admin+"/operator/"))
		tab.Wait("partner-over shown as limited",
			`document.querySelector('#clients tr[data-client="partner-over"] .badge')?.textContent === "limited"`)
		if got := browsertest.Eval[string](tab, `document.querySelector('#clients tr[data-client="partner-fine"] .badge').textContent`); got != "ok" {
			t.Fatalf("partner-fine's status on the page: %q, want ok", got)
		}
		if got := browsertest.Eval[[]string](tab, `[...document.querySelectorAll('#limited li')].map(li => li.dataset.client || "")`); len(got) != 1 || got[0] != "partner-over" {
			t.Fatalf("the page's 'limited right now': %q, want [partner-over]", got)
		}
		if got := browsertest.Eval[string](tab, `document.querySelector('#clients tr[data-client="partner-over"] td:nth-child(7)').textContent`); got != "7" {
			t.Fatalf("partner-over's refused total on the page: %q, want 7", got)
		}
		// The live chart: a uPlot canvas with the limited client's refusals as a series of its own.
		tab.Wait("the rates chart with partner-over's refusals",
			`document.querySelector('#chart canvas') !== null && [...document.querySelectorAll('#chart .u-legend th')].some(th => th.textContent.includes("partner-over refused"))`)
		tab.Wait("three points on the chart", `Number(document.body.dataset.points) >= 3`)
		tab.Screenshot(size.name)
	}
}
