package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/internal/llmtest"
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
	if !st.Store.Reachable || st.Store.Type != "memory" || st.Store.BreakerOpen || st.Store.Settlements != (sluice.SettlementStats{}) {
		t.Fatalf("store: %+v (nothing pending, nothing lost)", st.Store)
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
		// The store's settlements: nothing pending, nothing lost (the figures /v1/stats gives).
		for _, item := range []string{"settlements pending", "settlements lost"} {
			if got := browsertest.Eval[string](tab, `document.querySelector('#store div[data-item="`+item+`"] dd').textContent`); got != "0" {
				t.Fatalf("the page's %s: %q, want 0", item, got)
			}
		}
		tab.Screenshot(size.name)
	}
}

// The operator page's LLM usage, on a real gateway in front of the fake LLM API: no section while
// no client has used a usage route; then, once two clients have (one of them a model with a
// cached-input price, a stream that reports no usage, and over two dollars), a row per client
// and model whose figures are the ones GET /v1/stats gives (micro-dollars as dollars, exactly),
// with no row for the client that used none. At 1366 px the table fits; at 390 px the page does
// not grow wider than the screen. Screenshots go to artifacts/.
func TestServeE2EOperatorLLMUsage(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(llmtest.NewHandler())
	t.Cleanup(up.Close)
	keys := map[string]string{"alpha": "operator-llm-key-a", "beta": "operator-llm-key-b", "gamma": "operator-llm-key-c"}
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 100000000, period: 1000h}
clients:
  - {name: alpha, api_key_sha256: %s, policy: tpm}
  - {name: beta, api_key_sha256: %s, policy: tpm}
  - {name: gamma, api_key_sha256: %s, policy: tpm}
routes:
  - {path_prefix: /v1/chat/completions, usage: {format: openai}}
models:
  - {name: gpt-small, price: {input: 1, output: 4}}
  - {name: gpt-big, price: {input: 10, cached_input: 1, output: 40}}
`, listen, admin, up.URL, sha256Hex(keys["alpha"]), sha256Hex(keys["beta"]), sha256Hex(keys["gamma"]))
	})
	// gamma's traffic is on no usage route.
	for i := 0; i < 3; i++ {
		get(t, p.proxy, "/v1/models", "X-API-Key", keys["gamma"])
	}

	desktop := browsertest.NewTab(t, 1366, 900)
	desktop.Do("open the operator page", chromedp.Navigate(p.admin+"/operator/"))
	desktop.Wait("gamma's requests on the page", `document.querySelector('#clients tr[data-client="gamma"]') !== null`)
	if !browsertest.Eval[bool](desktop, `document.getElementById("llm").hidden`) {
		t.Fatal("the LLM usage section is shown while no client has used a usage route")
	}

	llmTraffic(t, p, keys["alpha"], keys["beta"])

	st := p.stats(t)
	// What the page must show, row by row, from the stats; and the stats are what the traffic was.
	want := map[string][]string{}
	var spent []int64
	for _, c := range st.Clients {
		for _, m := range c.LLM {
			want[c.Client+" "+m.Model] = []string{c.Client, m.Model, fmt.Sprint(m.Requests), fmt.Sprintf("%d (%d)", m.Input, m.CachedInput),
				fmt.Sprint(m.Output), fmt.Sprint(m.Reserved), fmt.Sprintf("$%d.%06d", m.MicroUSD/1e6, m.MicroUSD%1e6), fmt.Sprint(m.NoUsage), fmt.Sprint(m.Failed)}
			spent = append(spent, m.MicroUSD)
		}
	}
	if len(want) != 3 || want["alpha gpt-small"] == nil || want["alpha gpt-big"] == nil || want["beta gpt-small"] == nil {
		t.Fatalf("LLM usage in the stats: %v, want alpha's gpt-small and gpt-big and beta's gpt-small", want)
	}
	for row, w := range map[string]string{
		"alpha gpt-small": "[alpha gpt-small 2 120 (0) 53 204 $0.000332 1 0]", // 120×1 + 53×4; the stream reserved 2+100 and reported nothing
		"alpha gpt-big":   "[alpha gpt-big 1 200 (150) 10 102 $0.001050 0 0]", // 50×10 + 150×1 + 10×40
		"beta gpt-small":  "[beta gpt-small 1 1234567 (0) 250000 102 $2.234567 0 0]",
	} {
		if got := fmt.Sprint(want[row]); got != w {
			t.Errorf("stats for %s: %s, want %s", row, got, w)
		}
	}

	for _, v := range []struct {
		name  string
		tab   *browsertest.Tab
		width int
	}{{"operator-llm-desktop", desktop, 1366}, {"operator-llm-phone", nil, 390}} {
		tab := v.tab
		if tab == nil {
			tab = browsertest.NewTab(t, v.width, 1600)
			tab.Do("open the operator page on a phone's screen", chromedp.EmulateViewport(int64(v.width), 1600, chromedp.EmulateScale(2), chromedp.EmulateMobile),
				chromedp.Navigate(p.admin+"/operator/"))
		}
		tab.Wait("the LLM usage rows", `!document.getElementById("llm").hidden && document.querySelectorAll('#llm-usage tbody tr').length === 3`)
		got := browsertest.Eval[[][]string](tab, `[...document.querySelectorAll('#llm-usage tbody tr')].map(tr => [tr.dataset.client + " " + tr.dataset.model, ...[...tr.cells].map(c => c.textContent)])`)
		for _, row := range got {
			if fmt.Sprint(row[1:]) != fmt.Sprint(want[row[0]]) {
				t.Errorf("%s: the page's row %s: %q, want %q", v.name, row[0], row[1:], want[row[0]])
			}
		}
		if w := browsertest.Eval[int](tab, `document.documentElement.scrollWidth`); w > v.width {
			t.Errorf("%s: the page is %d px wide, wider than the window's %d", v.name, w, v.width)
		}
		if v.width >= 1366 && !browsertest.Eval[bool](tab, `(s => s.scrollWidth <= s.clientWidth)(document.querySelector('#llm .scroll'))`) {
			t.Errorf("%s: the LLM usage table does not fit its section", v.name)
		}
		tab.Screenshot(v.name)
	}
}

// llmTraffic sends four chat completions through p's usage route /v1/chat/completions, in front
// of the fake LLM API, and waits until they are counted: as the client of keyA, gpt-small (120
// in, 53 out), a gpt-small stream that reports no usage, and gpt-big (200 in, 150 of them
// cached, 10 out); as the client of keyB, gpt-small (1234567 in, 250000 out). Every response must
// be a 200.
func llmTraffic(t *testing.T, p *sluiceProc, keyA, keyB string) {
	t.Helper()
	post := func(key, body, usage string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.proxy+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		if usage != "" {
			req.Header.Set("X-Test-Usage", usage)
		}
		resp, err := e2eClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", body, resp.StatusCode, err)
		}
	}
	const small = `{"model":"gpt-small","max_tokens":100,"messages":[{"role":"user","content":"hello"}]`
	post(keyA, small+`}`, "input=120,output=53")
	post(keyA, small+`,"stream":true}`, "") // an OpenAI stream that did not ask for its usage
	post(keyA, strings.Replace(small, "gpt-small", "gpt-big", 1)+`}`, "input=200,output=10,cached=150")
	post(keyB, small+`}`, "input=1234567,output=250000")
	p.waitMetric(t, "sluice_llm_requests_total", nil, 4, 30*time.Second)
}

// layoutProblems is a script that lists what overflows on the page as it is laid out: the page
// wider than the window; an element that sticks out of its parent's box, or whose content sticks
// out of its own (a cell narrower than its text), outside a box that scrolls; a box that hides what
// it cannot hold (clipped). fits says every box that scrolls must also fit (the desktop: a table
// needs no scrolling there); without it, a table may scroll inside its own box (a phone).
const layoutProblems = `((fits) => {
  const out = [], doc = document.documentElement, seen = new Set();
  if (doc.scrollWidth > doc.clientWidth) out.push("the page is " + doc.scrollWidth + " px wide in a window of " + doc.clientWidth);
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + [...el.classList].map((c) => "." + c).join("") +
    (el.closest("[id]") && el.closest("[id]") !== el ? " in #" + el.closest("[id]").id : "");
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const note = (s) => { if (!seen.has(s)) { seen.add(s); out.push(s); } };
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest("[hidden], .visually-hidden, script") || el.getClientRects().length === 0) continue;
    const st = getComputedStyle(el), r = el.getBoundingClientRect();
    const inScroll = el.parentElement.closest(".scroll") !== null && scrolls(el.parentElement.closest(".scroll"));
    if (scrolls(el)) {
      if (fits && el.scrollWidth > el.clientWidth) note(name(el) + " scrolls: " + el.scrollWidth + " px of content in " + el.clientWidth);
      continue;
    }
    if (["hidden", "clip"].includes(st.overflowX) && el.scrollWidth > el.clientWidth + 1) note(name(el) + " clips: " + el.scrollWidth + " px of content in " + el.clientWidth);
    if (inScroll && !fits) continue;
    const p = el.parentElement.getBoundingClientRect();
    if (r.right > p.right + 1 || r.left < p.left - 1) note(name(el) + " sticks out of its parent: " + Math.round(r.left) + "–" + Math.round(r.right) + " px in " + Math.round(p.left) + "–" + Math.round(p.right));
    if (st.display !== "inline" && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1 && st.overflowX === "visible") note(name(el) + "'s content sticks out: " + el.scrollWidth + " px in " + el.clientWidth);
  }
  return out;
})`

// typeScale is a script that lists the font sizes of the page's visible text, each with where it
// is first used: one type scale has a few sizes, and a table's cells all the body's.
const typeScale = `(() => {
  const sizes = {}, cells = {};
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const el = n.parentElement;
    if (n.textContent.trim() === "" || el.closest("[hidden], .visually-hidden, script") || el.getClientRects().length === 0) continue;
    const px = getComputedStyle(el).fontSize;
    sizes[px] = sizes[px] || el.tagName.toLowerCase() + (el.closest("[id]") ? " in #" + el.closest("[id]").id : "");
    const cell = el.closest("td, th");
    if (cell && !el.closest("thead")) cells[px] = cells[px] || el.closest("table").id || el.closest("table").className;
  }
  return {sizes, cells};
})()`

// The operator page at the sizes people use, with real traffic in every section it shows: a
// client over its limit (refusals, early retries, the chart's series of its refusals) with a long
// name, anonymous floods, an unknown key, anonymous clients behind a proxy that is not trusted
// (the shared_address finding), and LLM usage. At 1366×768, 1400×900 and 1920×1080 every table
// fits its section and nothing overflows or is clipped; at 390×844 (a phone) tables scroll inside
// their own boxes and the page is no wider than the screen. The text is set in one type scale: at
// most five sizes on the page, and every table's body cells in the body's size. Screenshots go to
// artifacts/.
func TestServeE2EOperatorLayout(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(llmtest.NewHandler())
	t.Cleanup(up.Close)
	keys := map[string]string{"alpha": "layout-key-a", "beta": "layout-key-b", "over": "layout-key-over"}
	const overName = "partner-eu-west-billing-exports"
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - api_key: {header: X-API-Key}
  - ip: {trusted_proxies: [127.0.0.1/32]}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 100000000, period: 1000h}
  - {name: small, algorithm: token-bucket, limit: 3, period: 1h}
  - {name: anon, algorithm: fixed-window, limit: 5, period: 24h}
default_policy: anon
clients:
  - {name: alpha, api_key_sha256: %s, policy: tpm}
  - {name: beta, api_key_sha256: %s, policy: tpm}
  - {name: %s, api_key_sha256: %s, policy: small}
routes:
  - {path_prefix: /v1/chat/completions, usage: {format: openai}}
models:
  - {name: gpt-small, price: {input: 1, output: 4}}
  - {name: gpt-big, price: {input: 10, cached_input: 1, output: 40}}
`, listen, admin, up.URL, sha256Hex(keys["alpha"]), sha256Hex(keys["beta"]), overName, sha256Hex(keys["over"]))
	})
	llmTraffic(t, p, keys["alpha"], keys["beta"])
	for i := 0; i < 10; i++ {
		get(t, p.proxy, "/v1/models", "X-API-Key", keys["over"], "X-Forwarded-For", "192.0.2.10") // 3 pass, 7 refused
	}
	for i := 0; i < 30; i++ {
		get(t, p.proxy, "/v1/models", "X-Forwarded-For", "203.0.113.1")
		get(t, p.proxy, "/v1/models", "X-Forwarded-For", "2001:db8:85a3::8a2e:370:7334", "X-API-Key", "a-key-nobody-has")
	}
	for i := 0; i < 3; i++ { // anonymous clients behind 192.0.2.50, not a trusted proxy
		get(t, p.proxy, "/v1/models", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d, 192.0.2.50", 200+i))
	}
	kinds := map[string]bool{}
	for _, f := range p.stats(t).Diagnosis.Findings {
		kinds[f.Kind] = true
	}
	if !kinds["shared_address"] || !kinds["heavy_hitter"] || !kinds["unknown_api_key"] {
		t.Fatalf("findings: %v, want shared_address, heavy_hitter and unknown_api_key among them", kinds)
	}

	for _, v := range []struct {
		name          string
		width, height int
		phone         bool
	}{{"operator-1366", 1366, 768, false}, {"operator-1400", 1400, 900, false}, {"operator-1920", 1920, 1080, false}, {"operator-390", 390, 844, true}} {
		tab := browsertest.NewTab(t, v.width, v.height)
		if v.phone {
			tab.Do("a phone's screen", chromedp.EmulateViewport(int64(v.width), int64(v.height), chromedp.EmulateScale(2), chromedp.EmulateMobile))
		}
		tab.Do("open the operator page", chromedp.Navigate(p.admin+"/operator/"))
		tab.Wait("every section filled", `!document.getElementById("llm").hidden && document.querySelectorAll('#llm-usage tbody tr').length === 3 &&
			document.querySelector('#findings li[data-kind="shared_address"]') !== null &&
			document.querySelector('#clients tr[data-client="`+overName+`"] .badge')?.textContent === "limited" &&
			[...document.querySelectorAll('#chart .u-legend th')].some(th => th.textContent.includes("`+overName+` refused")) &&
			Number(document.body.dataset.points) >= 3`)
		if got := browsertest.Eval[[]string](tab, layoutProblems+"("+fmt.Sprint(!v.phone)+")"); len(got) > 0 {
			t.Errorf("%s: %d overflow problems:\n%s", v.name, len(got), strings.Join(got, "\n"))
		}
		scale := browsertest.Eval[struct{ Sizes, Cells map[string]string }](tab, typeScale)
		body := browsertest.Eval[string](tab, `getComputedStyle(document.body).fontSize`)
		if len(scale.Sizes) > 5 || len(scale.Cells) != 1 || scale.Cells[body] == "" {
			t.Errorf("%s: font sizes %v (the body's %s), in tables' cells %v; want at most 5 sizes, and every table's cells in the body's", v.name, scale.Sizes, body, scale.Cells)
		}
		tab.Screenshot(v.name)
	}
}
