package gateway_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/web"
)

// The operator page opens with history: two gateways on one real Redis get traffic (alpha on a,
// beta on b, both partly refused) BEFORE the page is opened; once a slot holding it has ended,
// headless Chromium opens a's operator page, at 1366×768 and on a 390×844 phone. Its chart holds
// points from before the page loaded (the first one's time before the load, with alpha's
// refusals among them), then the live polls after; the fleet's chart shows the two instances'
// slot with beta's refusals, which a never decided. The page is no wider than the screen. The
// charts' span goes to the last 2 minutes and back. Screenshots go to artifacts/.
func TestOperatorPageHistory(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	var srvs [2]*gateway.Server
	admin := ""
	for i := range srvs {
		srvs[i] = fleetServer(t, rs.Addr)
	}
	srvs[0].Mount("GET /", web.Handler())
	hs := httptest.NewServer(srvs[0].Admin())
	t.Cleanup(hs.Close)
	admin = hs.URL
	sent := time.Now()
	for i := 0; i < 8; i++ {
		decideAs(t, srvs[0], "alpha", "") // 5 allowed, 3 refused
		decideAs(t, srvs[1], "beta", "")  // 5 allowed, 3 refused
	}
	// Wait for the slot of that traffic to end and be in both histories (each gateway folds every
	// few seconds; a read folds too).
	deadline := time.Now().Add(30 * time.Second)
	for {
		gateway.FoldHistory(srvs[1])
		var h gateway.HistoryReport
		if code, detail := getJSON(t, admin+"/v1/history", &h); code != 200 {
			t.Fatalf("GET /v1/history: %d %s", code, detail)
		}
		var mine, fleet uint64
		for _, s := range h.Instance {
			mine += s.Refused
		}
		for _, s := range h.Fleet {
			fleet += s.Refused
		}
		if mine == 3 && fleet == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the traffic (sent at %v), the history holds %d of a's refusals and %d of the fleet's; want 3 and 6: %+v", sent, mine, fleet, h)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, v := range []struct {
		name          string
		width, height int
		phone         bool
	}{{"operator-history-1366", 1366, 768, false}, {"operator-history-390", 390, 844, true}} {
		tab := browsertest.NewTab(t, v.width, v.height)
		if v.phone {
			tab.Do("a phone's screen", chromedp.EmulateViewport(int64(v.width), int64(v.height), chromedp.EmulateScale(2), chromedp.EmulateMobile))
		}
		tab.Do("open the operator page", chromedp.Navigate(admin+"/operator/"))
		tab.Wait("the chart with points from before the page loaded, then live ones", `(() => {
			const d = document.getElementById("chart").dataset, loaded = Number(document.body.dataset.loaded);
			return Number(d.historyPoints) >= 1 && Number(d.pointsBeforeLoad) >= 1 && Number(d.first) < loaded &&
				Number(d.refusedBeforeLoad) > 0 && Number(d.last) > loaded && document.querySelector("#chart canvas") !== null;
		})()`)
		tab.Wait("the fleet's chart: two instances, beta's refusals", `(() => {
			const box = document.getElementById("fleet-rates"), d = document.getElementById("fleet-chart").dataset;
			return !box.hidden && d.instances === "2" && Number(d.first) < Number(document.body.dataset.loaded) && Number(d.refusedBeforeLoad) > 0 &&
				[...document.querySelectorAll("#fleet-chart .u-legend th")].some((th) => th.textContent.includes("beta refused"));
		})()`)
		// The instance's history named alpha (refused here), never beta (refused on b only).
		if got := browsertest.Eval[[]string](tab, `[...document.querySelectorAll("#chart .u-legend th")].map((th) => th.textContent)`); !strings.Contains(fmt.Sprint(got), "alpha refused") ||
			strings.Contains(fmt.Sprint(got), "beta") {
			t.Errorf("%s: the instance chart's series %q; want alpha's refusals and not beta's", v.name, got)
		}
		if got := browsertest.Eval[string](tab, `(() => { const d = document.documentElement; return d.scrollWidth > d.clientWidth ? d.scrollWidth + " px in " + d.clientWidth : ""; })()`); got != "" {
			t.Errorf("%s: the page is wider than the screen: %s", v.name, got)
		}
		if got := browsertest.Eval[string](tab, `document.getElementById("history-note").textContent`); got != "" {
			t.Errorf("%s: the history's note says %q; want nothing (both histories read)", v.name, got)
		}
		tab.Screenshot(v.name)
		if !v.phone {
			// The span: the last 2 minutes, on both charts, and back to the hour.
			for _, sp := range []string{"120", "3600"} {
				tab.Do("the span "+sp, chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("chart-span"); s.value = "`+sp+`"; s.dispatchEvent(new Event("change")); })()`))
				tab.Wait("both charts over "+sp+" s", `document.getElementById("chart").dataset.span === "`+sp+`" && document.getElementById("fleet-chart").dataset.span === "`+sp+`"`)
			}
		}
	}
}
