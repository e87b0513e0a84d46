package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
)

// rlqsOverflow lists what of the page is wider than the window, and with fits, each of the RLQS
// section's scrolling boxes whose table does not fit it (on a laptop's screen none may scroll).
const rlqsOverflow = `((fits) => {
  const out = [], doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth) out.push("the page is " + doc.scrollWidth + " px wide in a window of " + doc.clientWidth);
  for (const el of document.querySelectorAll("#rlqs *")) {
    if (el.getClientRects().length === 0 || el.closest(".visually-hidden")) continue;
    const r = el.getBoundingClientRect(), p = el.parentElement.getBoundingClientRect();
    const scrolls = getComputedStyle(el).overflowX === "auto";
    if (scrolls && fits && el.scrollWidth > el.clientWidth) out.push((el.firstElementChild?.className || el.tagName) + " scrolls: " + el.scrollWidth + " px in " + el.clientWidth);
    if (!el.parentElement.closest("#rlqs .scroll") && (r.right > p.right + 1 || r.left < p.left - 1)) out.push(el.tagName + "." + el.className + " sticks out: " + Math.round(r.right) + " px in " + Math.round(p.right));
  }
  return out;
})`

// The operator page's Envoys (RLQS) section, at 1366×768 and on a 390×844 phone: instance a's two
// streams; alice's chat bucket with its limit, demand and assignment, flagged over its limit,
// its two Envoys here (token buckets) and b's from the ledger; the health bucket's blanket. At
// 1366 px every table fits its section; on the phone the page is no wider than the screen (the
// tables scroll in their own boxes). No bucket id's value (alice) is on the page. Screenshots go
// to artifacts/.
func TestOperatorPageRLQS(t *testing.T) {
	t.Parallel()
	f := startQuotaFleet(t, web.Handler())
	for _, v := range []struct {
		name          string
		width, height int
		phone         bool
	}{{"operator-rlqs-1366", 1366, 768, false}, {"operator-rlqs-390", 390, 844, true}} {
		tab := browsertest.NewTab(t, v.width, v.height)
		if v.phone {
			tab.Do("a phone's screen", chromedp.EmulateViewport(int64(v.width), int64(v.height), chromedp.EmulateScale(2), chromedp.EmulateMobile))
		}
		tab.Do("open the operator page", chromedp.Navigate(f.admin+"/operator/"))
		tab.Wait("the RLQS section with a's two streams", `!document.getElementById("rlqs").hidden && document.querySelectorAll("#rlqs-streams tr[data-stream]").length === 2`)
		tab.Wait("alice's bucket: two Envoys here with token buckets, b's from the ledger, flagged over its limit", `(() => {
			const t = [...document.querySelectorAll('table.rlqs-bucket[data-rule="chat"]')].find(t => t.querySelectorAll("tr[data-envoy]").length === 3);
			if (!t) return false;
			const here = [...t.querySelectorAll('tr[data-here="true"]')], there = t.querySelector('tr[data-here="false"]');
			const head = t.parentElement.previousElementSibling;
			return here.length === 2 && here.every(tr => tr.cells[6].textContent.startsWith("token bucket") && /^[0-9]+ \([0-9]+ tokens\)$/.test(tr.cells[5].textContent)) &&
				there?.cells[1].textContent === "another (ledger)" && there.cells[6].textContent === "lease" &&
				head.textContent.includes("limit 10 per 1 min") && head.textContent.includes("all instances' Envoys want") && head.querySelector(".limited") !== null &&
				head.querySelector(".id").textContent.startsWith("{name: chat, user: sha256:");
		})()`)
		tab.Wait("health's blanket", `document.querySelector('p.bucket[data-rule="health"]')?.textContent.includes("blanket allow (ALLOW_ALL)") &&
			document.querySelector('table.rlqs-bucket[data-rule="health"] tr[data-envoy] td:nth-child(7)')?.textContent.startsWith("allow all")`)
		tab.Wait("the demand finding", `document.querySelector('#findings li[data-kind="rlqs_demand_over_limit"]') !== null`)
		if got := browsertest.Eval[[]string](tab, rlqsOverflow+"("+fmt.Sprint(!v.phone)+")"); len(got) > 0 {
			t.Errorf("%s: %d overflow problems:\n%s", v.name, len(got), strings.Join(got, "\n"))
		}
		if browsertest.Eval[bool](tab, `document.body.textContent.includes("alice")`) {
			t.Errorf("%s: the page shows the bucket id value alice", v.name)
		}
		tab.Screenshot(v.name)
	}
}
