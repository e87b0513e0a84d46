package gateway_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
)

// The operator page's needs: after an hour of traffic on the virtual clock, it shows steady's
// limit flagged as far above its use and busy's as too low; a what-if of busy's policy at its
// own limit refuses what the gateway refused, and at a higher one none. Screenshots go to
// artifacts/.
func TestOperatorPageNeeds(t *testing.T) {
	t.Parallel()
	srv, clock, admin := clockedServer(t, web.Handler())
	busyRefused, _ := feedDay(t, srv, clock, 60)
	if busyRefused != 6*30 {
		t.Fatalf("busy refused %d, want 180", busyRefused)
	}
	tab := browsertest.NewTab(t, 1280, 900)
	tab.Do("open the operator page", chromedp.Navigate(admin+"/operator/"))
	tab.Wait("steady flagged far above its use",
		`document.querySelector('#needs-table tr[data-client="steady"][data-flags~="far_above"] .badge[data-kind="far_above"]')?.textContent.includes("limit 1000/min, p99 use 10/min")`)
	tab.Wait("busy flagged too low", `document.querySelector('#needs-table tr[data-client="busy"]')?.dataset.flags === "too_low"`)
	if got := browsertest.Eval[string](tab, `document.querySelector('#needs-table tr[data-client="busy"] td:nth-child(8)').textContent`); got != "180" {
		t.Fatalf("busy's refused on the page: %q, want 180", got)
	}
	for _, c := range []struct{ limit, wouldRefuse string }{{"100", "180"}, {"130", "0"}} {
		tab.Do("a what-if of busy at "+c.limit,
			chromedp.Evaluate[chromedp.Void](`(() => {
				document.getElementById("whatif-target").value = '["busy","tight"]';
				const el = document.getElementById("whatif-limit"); el.focus(); el.value = "";
			})()`),
			chromedp.KeyEvent(c.limit),
			chromedp.Click(chromedp.CSS(`#whatif button`)))
		tab.Wait("the what-if's answer at "+c.limit, `document.getElementById("whatif-result").dataset.wouldRefuse === "`+c.wouldRefuse+`"`)
		if got := browsertest.Eval[string](tab, `document.getElementById("whatif-result").dataset.refusedAsRecorded`); got != "180" {
			t.Fatalf("refused as recorded on the page: %q, want 180", got)
		}
	}
	tab.Wait("the memory store's fleet: this instance, no fleet chart", `document.getElementById("history-note").textContent === "the memory store: this instance is the whole fleet" && document.getElementById("fleet-rates").hidden`)
	tab.Screenshot("operator-needs")
}
