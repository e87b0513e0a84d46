package web_test

// The page shows the answer first (issue 36): at load, without a touch, the summary of all five
// algorithms and every chart are in the first screen; live mode's cards, traffic text and marks
// follow every change; a pause shows the command that prints the same totals; the clock keeps
// real time.

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/web"
	"github.com/sluicehq/sluice/web/scenario"
)

// aboveTheFold lists what of the answer is not whole and drawn within the first screen: on a
// laptop the summary table's five rows, on a phone each card's line of totals (the table comes
// after the cards there); and on both every chart's canvas, which must have pixels drawn.
const aboveTheFold = `(() => {
	const bad = [];
	const within = (el, name) => {
		const r = el.getBoundingClientRect();
		if (r.width === 0 || r.height === 0) bad.push(name + ': not shown');
		else if (r.bottom > innerHeight || r.top < 0 || r.right > innerWidth) bad.push(name + ': ends at ' + Math.round(r.bottom) + ' px, the screen at ' + innerHeight);
	};
	const cards = [...document.querySelectorAll('#cards .card')];
	if (cards.length !== 5) bad.push(cards.length + ' cards');
	if (innerWidth >= 1200) {
		const rows = [...document.querySelectorAll('#summary tbody tr')];
		if (rows.length !== 5) bad.push(rows.length + ' summary rows');
		for (const tr of rows) {
			within(tr, 'summary row ' + tr.dataset.algorithm);
			if (!/^\d+$/.test(tr.querySelector('td[data-field=allowed]')?.textContent || '')) bad.push('summary row ' + tr.dataset.algorithm + ': no allowed count');
		}
	} else {
		for (const c of cards) {
			const f = c.querySelector('.figures');
			within(f, c.id + ' totals');
			if (!/^[\d,]+ of [\d,]+ allowed · [\d,]+ refused/.test(f.textContent)) bad.push(c.id + ' totals: ' + JSON.stringify(f.textContent));
		}
	}
	for (const c of cards) {
		const canvases = [...c.querySelectorAll('canvas')];
		if (canvases.length < 2) bad.push(c.id + ': ' + canvases.length + ' charts');
		for (const cv of canvases) {
			const name = c.id + ' ' + cv.closest('.chart').className;
			within(cv, name);
			const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
			let drawn = 0;
			for (let i = 3; i < px.length; i += 4) if (px[i]) drawn++;
			if (drawn < 50) bad.push(name + ': nothing drawn');
		}
	}
	return bad;
})()`

// The page opens on the answer, at a laptop's and a phone's size: the whole run computed at
// once (the clock at its end, not playing), the summary of all five and every chart in the first
// screen without a touch; the same for the buggy partner on three instances once chosen, whose
// settings stay folded. Screenshots go to artifacts/.
func TestBrowserAnswerFirst(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	for _, size := range []screen{laptop, phone} {
		t.Run(size.name, func(t *testing.T) {
			page := size.open(t)
			page.Open(srv.URL + "/")
			page.WaitComplete(canonical(t, burstQuery))
			if page.Running() {
				t.Error("the clock plays at load: the page should open on the whole run")
			}
			if got := browsertest.Eval[string](page.Tab, "document.getElementById('play').textContent"); got != "Replay" {
				t.Errorf("the play button says %q at load", got)
			}
			if bad := browsertest.Eval[[]string](page.Tab, aboveTheFold); len(bad) > 0 {
				t.Errorf("at load:\n%s", strings.Join(bad, "\n"))
			}
			page.Screenshot("web-simulation-answer-" + size.name)

			var partners string
			for _, p := range scenario.Presets {
				if p.Name == "partners" {
					partners = p.Query
				}
			}
			page.Click(`#presets button[data-preset="partners"]`)
			page.WaitComplete(partners)
			if browsertest.Eval[bool](page.Tab, "document.getElementById('more').open") {
				t.Error("choosing the partners opened More settings")
			}
			if got := text(page, "#more summary"); !strings.Contains(got, "instances 3") || !strings.Contains(got, "store separate") {
				t.Errorf("More settings' fold says %q, not what the scenario sets under it", got)
			}
			if bad := browsertest.Eval[[]string](page.Tab, aboveTheFold); len(bad) > 0 {
				t.Errorf("the partners on 3 instances:\n%s", strings.Join(bad, "\n"))
			}
			if bad := browsertest.Eval[[]string](page.Tab, overflowing); len(bad) > 0 {
				t.Errorf("the partners on 3 instances, wider than their container:\n%s", strings.Join(bad, "\n"))
			}
			page.Screenshot("web-simulation-answer-partners-" + size.name)
		})
	}
}

// badgeOverlaps lists the marks' badges that overlap each other or their chart's data area.
const badgeOverlaps = `(() => {
	const bad = [];
	const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
	for (const card of document.querySelectorAll('#cards .card')) {
		const over = card.querySelector('.traffic-chart .u-over').getBoundingClientRect();
		const badges = [...card.querySelectorAll('.marks .mark')].map((b) => [b.textContent, b.getBoundingClientRect()]);
		badges.forEach(([n, r], i) => {
			if (hit(r, over)) bad.push(card.id + ' mark ' + n + ' over the plot');
			for (const [m, q] of badges.slice(i + 1)) if (hit(r, q)) bad.push(card.id + ' marks ' + n + ' and ' + m + ' overlap');
		});
	}
	return bad;
})()`

// Live mode follows every change, at a laptop's and a phone's size. The wall clock is the
// test's own (FakeClock): 3 s of it show 3 s on the clock at 1×. A new limit shows on every
// card (its numbers and words), a new rate in the traffic text, rounded to the tenth of a second;
// each change is a numbered mark whose badge covers neither the data nor another badge, listed
// under the plots. Paused, the page shows the `sluice simulate` command on screen, and that very
// command, run, prints the page's totals.
func TestBrowserLiveFollowsChanges(t *testing.T) {
	bin := browsertest.SluiceBinary(t)
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	for _, size := range []screen{laptop, phone} {
		t.Run(size.name, func(t *testing.T) {
			page := size.open(t)
			page.Open(srv.URL + "/?" + burstQuery)
			page.FakeClock()
			page.Click("#live")
			page.Wait("live mode, running", `document.getElementById('play').textContent === 'Pause' && !document.getElementById('live-bar').hidden`)

			// The clock keeps real time at 1×: the fake wall clock's 3 s are the clock's 3 s.
			page.AdvanceClock(3000)
			page.Wait("the clock at 3 s", `document.getElementById('clock').dataset.us === '3000000'`)
			if got := text(page, "#clock"); got != "3s" {
				t.Errorf("after 3 s at 1× the clock shows %q", got)
			}

			// A new limit, at 3 s: every card says it, in numbers and words.
			page.Type("limit", "9")
			page.Do("entering the limit", chromedp.KeyEvent("\r"))
			page.Wait("the change", `location.search.includes('change=t%3D3s%2Climit%3D9')`)
			page.Wait("the cards to say limit 9", `[...document.querySelectorAll('#cards .policy-now')].every(p => p.textContent.startsWith('limit 9 per 1s'))`)
			if d := text(page, "#card-fixed-window .description"); !strings.HasPrefix(d, "At most 9 in each 1s window") {
				t.Errorf("fixed-window's description after the change: %q", d)
			}
			if d := text(page, "#card-token-bucket .description"); !strings.Contains(d, "refilled 9 per 1s") {
				t.Errorf("token-bucket's description after the change: %q", d)
			}

			// A new rate 1.5 s later: the traffic text reads it, in tenths of a second.
			page.AdvanceClock(1500)
			page.Wait("the clock at 4.5 s", `document.getElementById('clock').dataset.us === '4500000'`)
			page.Type("live-rate", "4")
			page.Do("entering the rate", chromedp.KeyEvent("\r"))
			page.AdvanceClock(2050)
			page.Wait("the clock at 6.55 s", `document.getElementById('clock').dataset.us === '6550000'`)
			if got := page.Value("traffic"); got != "10/s for 4.5s; 4/s for 2s" {
				t.Errorf("the traffic text at 6.55 s: %q", got)
			}
			// Marks close together: a burst sent, the burst and the limit changed, a tenth of a
			// second apart.
			page.Click("#live-send")
			page.AdvanceClock(100)
			page.Wait("the clock at 6.65 s", `document.getElementById('clock').dataset.us === '6650000'`)
			page.Type("burst", "3")
			page.Do("entering the burst", chromedp.KeyEvent("\r"))
			page.AdvanceClock(100)
			page.Wait("the clock at 6.75 s", `document.getElementById('clock').dataset.us === '6750000'`)
			page.Type("limit", "7")
			page.Do("entering the limit", chromedp.KeyEvent("\r"))
			page.Wait("five marks on every traffic chart", `[...document.querySelectorAll("#cards .marks")].every(m => m.children.length === 5)`)
			if bad := browsertest.Eval[[]string](page.Tab, badgeOverlaps); len(bad) > 0 {
				t.Errorf("the marks' badges:\n%s", strings.Join(bad, "\n"))
			}
			list := text(page, "#marks-list")
			for _, want := range []string{"1 at 3s: limit 9", "2 at 4.5s: traffic 4/s", "3 at 6.5s: 20 at once", "4 at 6.6s: burst 3", "5 at 6.7s: limit 7"} {
				if !strings.Contains(list, want) {
					t.Errorf("the marks' list %q has no %q", list, want)
				}
			}
			page.Wait("the cards to say limit 7, burst 3", `document.querySelector('#card-token-bucket .policy-now').textContent === 'limit 7 per 1s · burst 3'`)

			// Paused: the command on screen, which prints the page's totals.
			page.AdvanceClock(1234)
			page.Wait("the clock at 7.984 s", `document.getElementById('clock').dataset.us === '7984000'`)
			page.Click("#play")
			page.Wait("the paused run's whole summary and its command", `document.getElementById('summary').dataset.complete === 'true' &&
				!document.getElementById('paused-command').hidden`)
			if bad := browsertest.Eval[[]string](page.Tab, `(() => { const r = document.getElementById('paused-cmd').getBoundingClientRect();
				return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight ? [] : ['the command at ' + r.top + '..' + r.bottom]; })()`); len(bad) > 0 {
				t.Errorf("paused, the command is not on screen: %s", bad)
			}
			cmd := text(page, "#paused-cmd")
			for _, want := range []string{"sluice simulate --compare ", "--change t=3s,limit=9", "--change t=6.6s,burst=3", "--change t=6.7s,limit=7",
				"--traffic '10/s for 4.5s; 4/s for 2s; 20 at once; 4/s for 1.4s'"} {
				if !strings.Contains(cmd, want) {
					t.Errorf("the paused command %q has no %q", cmd, want)
				}
			}
			if strings.Contains(cmd, "\n") || !strings.HasPrefix(cmd, "sluice ") {
				t.Fatalf("the paused command: %q", cmd)
			}
			out, err := exec.Command(bin, browsertest.ShellWords(cmd)[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
			got := page.Summaries()
			totals := cliTotals(t, string(out))
			for alg, row := range totals {
				for field, v := range row {
					if got[alg][field] != v {
						t.Errorf("%s %s: the page says %q, the command %q", alg, field, got[alg][field], v)
					}
				}
			}
			if len(totals) != 5 {
				t.Errorf("the command's totals: %v\n%s", totals, out)
			}
			page.Screenshot("web-simulation-live-paused-" + size.name)
		})
	}
}

// cliTotals reads the totals table that `sluice simulate --compare` prints last: algorithm →
// offered, allowed, refused, delayed.
func cliTotals(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	totals := map[string]map[string]string{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "algorithm" {
			in = true
			continue
		}
		if in && len(f) == 0 {
			break
		}
		if !in || len(f) < 6 {
			continue
		}
		// algorithm offered allowed % refused delayed ...
		totals[f[0]] = map[string]string{"offered": f[1], "allowed": f[2], "refused": f[4], "delayed": f[5]}
	}
	return totals
}

// TestMain removes the sluice binary that browsertest.SluiceBinary built, if any, once the tests are done.
func TestMain(m *testing.M) {
	code := m.Run()
	browsertest.RemoveSluiceBinary()
	os.Exit(code)
}
