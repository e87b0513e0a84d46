package region_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/web"
)

// TestRegionOperatorPage: the operator page of eu's gateway has a Regions section: for the
// global policy, eu's row as it enforces it (demand, allotment, use, lease, state) and us's as
// the ledger has it; the ledger killed and eu's lease over, eu's row says it runs on its safe
// share, flagged. Screenshots go to artifacts/.
func TestRegionOperatorPage(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", oneRegion, global, false)
	us := startRegion(t, "us", oneRegion, global, false)
	ctx := context.Background()
	for range 3 {
		eu.get(t)
	}
	// Past the new ledger's learning (a lease and the hold), both on a grant.
	waitFor(t, patience, "both regions on a grant", func() bool {
		us.ref.RefreshAll(ctx)
		eu.ref.RefreshAll(ctx)
		e, u := eu.ref.Stats()[0], us.ref.Stats()[0]
		return !e.Learning && !e.Floor && !u.Learning && !u.Floor
	})
	// The loops keep the leases from now on (a lease is a second here).
	eu.ref.Start()
	us.ref.Start()
	st := eu.ref.Stats()[0]
	if len(st.Ledger) != 2 || st.Ledger[0].Region != "eu" || st.Ledger[1].Region != "us" || !st.Ledger[1].Live {
		t.Fatalf("eu's view of the ledger: %+v; want eu and us, live", st.Ledger)
	}
	eu.srv.Mount("GET /", web.Handler()) // the page's chart library
	admin := httptest.NewServer(eu.srv.Admin())
	t.Cleanup(admin.Close)
	tab := browsertest.NewTab(t, 1280, 900)
	tab.Do("open eu's operator page", chromedp.Navigate(admin.URL+"/operator/"))
	tab.Wait("the Regions section", `!document.getElementById("regions").hidden && document.getElementById("regions-name").textContent.includes("eu")`)
	tab.Wait("eu's row", `(() => {
		const c = [...(document.querySelector('table.regions[data-policy="partner"] tr[data-region="eu"]')?.cells || [])].map(x => x.textContent);
		return c.length === 6 && c[0] === "eu (here)" && /^[0-9]+$/.test(c[1]) && Number(c[2]) >= 10 && /^[0-9]+$/.test(c[3]) && c[5].startsWith("lease");
	})()`)
	tab.Wait("us's row from the ledger", `document.querySelector('table.regions[data-policy="partner"] tr[data-region="us"] td:nth-child(6)')?.textContent === "lease (ledger)"`)
	tab.Screenshot("operator-regions")

	global.Kill()
	waitFor(t, patience, "eu on its safe share", func() bool { return eu.ref.Stats()[0].Safe })
	tab.Wait("eu's row flagged on its safe share", `(() => {
		const tr = document.querySelector('table.regions[data-policy="partner"] tr[data-region="eu"]');
		return tr?.dataset.safe === "true" && tr.cells[5].textContent.startsWith("on its safe share") && tr.cells[5].querySelector(".limited") !== null;
	})()`)
	tab.Screenshot("operator-regions-safe")
}
