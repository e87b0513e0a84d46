package web_test

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
)

// overflowing lists the visible elements that stick out of their parent or whose content is
// wider than they are ("div.card > p.description: 412 > 380"), leaving out what scrolls or clips
// by design (a table's scrolling box and what is in it) and what is positioned on its own.
const overflowing = `(() => {
	const bad = [];
	const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.classList.length ? '.' + [...el.classList].join('.') : '');
	const scrolls = (el) => { for (let a = el; a; a = a.parentElement) if (getComputedStyle(a).overflowX !== 'visible') return true; return false; };
	for (const el of document.querySelectorAll('body *')) {
		const cs = getComputedStyle(el);
		if (cs.display === 'none' || cs.visibility === 'hidden' || cs.position === 'absolute' || cs.position === 'fixed') continue;
		// A box-less wrapper (display: contents) lays nothing out: its children are its parent's.
		let p = el.parentElement;
		while (p && getComputedStyle(p).display === 'contents') p = p.parentElement;
		if (scrolls(p)) continue;
		const r = el.getBoundingClientRect(), pr = p.getBoundingClientRect();
		if (r.width === 0 || r.height === 0) continue;
		if (r.left < pr.left - 1 || r.right > pr.right + 1) {
			bad.push(name(p) + ' > ' + name(el) + ': ' + Math.round(r.left) + '..' + Math.round(r.right) + ' outside ' + Math.round(pr.left) + '..' + Math.round(pr.right));
		}
		if (cs.overflowX === 'visible' && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
			bad.push(name(el) + ': content ' + el.scrollWidth + ' px wide in ' + el.clientWidth);
		}
	}
	if (document.documentElement.scrollWidth > innerWidth) bad.push('the page: ' + document.documentElement.scrollWidth + ' px wide in ' + innerWidth);
	return bad;
})()`

// screen is a browser's screen: a laptop's, a desktop's or a phone's.
type screen struct {
	name          string
	width, height int64
	phone         bool
}

var (
	laptop = screen{"1366x768", 1366, 768, false}
	phone  = screen{"390x844", 390, 844, true}
)

// open starts Chromium with a tab of the screen's size (a phone's: mobile, at twice the pixels).
func (s screen) open(t *testing.T) browsertest.Simulation {
	t.Helper()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, int(s.width), int(s.height))}
	opts := []chromedp.EmulateViewportOption{}
	if s.phone {
		opts = append(opts, chromedp.EmulateScale(2), chromedp.EmulateMobile)
	}
	page.Do("the screen's size", chromedp.EmulateViewport(s.width, s.height, opts...))
	return page
}

// The page at a laptop's, a desktop's and a phone's size: the scenarios come first and the
// first chart is within the first screen, nothing is wider than its container, and a phone's
// page is a few screens, not a dozen. Screenshots go to artifacts/.
func TestBrowserLayout(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	for _, size := range []screen{laptop, {"1920x1080", 1920, 1080, false}, phone} {
		t.Run(size.name, func(t *testing.T) {
			page := size.open(t)
			page.Open(srv.URL + "/")
			page.Click("#end")
			page.WaitComplete(canonical(t, burstQuery))

			if first := browsertest.Eval[string](page.Tab, `document.querySelector('main section').className`); first != "scenarios" {
				t.Errorf("the page starts with %q, not the scenarios", first)
			}
			if browsertest.Eval[bool](page.Tab, "document.getElementById('more').open") {
				t.Error("the advanced settings are open on a bare address")
			}
			// The first chart (fixed-window's requests) whole within the first screen.
			bottom := browsertest.Eval[float64](page.Tab, `document.querySelector('#card-fixed-window .traffic-chart canvas').getBoundingClientRect().bottom`)
			if bottom > float64(size.height) {
				t.Errorf("the first chart ends %.0f px down, below the first screen (%d px)", bottom, size.height)
			}
			if bad := browsertest.Eval[[]string](page.Tab, overflowing); len(bad) > 0 {
				t.Errorf("wider than their container:\n%s", strings.Join(bad, "\n"))
			}
			if height := browsertest.Eval[int](page.Tab, "document.documentElement.scrollHeight"); size.phone && height > 5000 {
				t.Errorf("on a phone the page is %d px tall", height)
			}
			// No placeholder in a legend when nothing is hovered: the totals so far.
			if legend := browsertest.Eval[[]string](page.Tab, `[...document.querySelectorAll('.u-legend .u-value')].map(v => v.textContent)`); slices.Contains(legend, "–") {
				t.Errorf("the legends read %q", legend)
			}
			page.Screenshot("web-simulation-" + size.name)
		})
	}
}
