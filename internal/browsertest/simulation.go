package browsertest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// Simulation drives the browser simulation page (web/assets) in a tab, through what a person
// uses: its inputs, buttons and summary table. It waits on the page's DOM, never on time.
type Simulation struct{ *Tab }

// Open loads url and waits until the page shows its first run (or its errors).
func (s Simulation) Open(url string) {
	s.t.Helper()
	s.Do("loading "+url, chromedp.Navigate(url))
	s.Wait("the simulator to start", `document.getElementById('summary').dataset.query || document.querySelector('[aria-invalid=true]')`)
}

// Type replaces the text of the input with this id as typing does: each key fires an input event.
// An input under a closed fold (details) is typed into as a person would: the fold opened first.
func (s Simulation) Type(id, text string) {
	s.t.Helper()
	el := "document.getElementById(" + JSString(id) + ")"
	s.Do("typing into #"+id, chromedp.Evaluate[chromedp.Void](`(() => { const el = `+el+`;
		for (let d = el.closest('details'); d; d = d.parentElement.closest('details')) d.open = true;
		el.focus(); el.value = ''; })()`), chromedp.KeyEvent(text))
}

// Click clicks the element that the CSS selector finds.
func (s Simulation) Click(selector string) {
	s.t.Helper()
	s.Do("clicking "+selector, chromedp.Click(chromedp.CSS(selector)))
}

// Value returns the value of the input with this id.
func (s Simulation) Value(id string) string {
	s.t.Helper()
	return Eval[string](s.Tab, "document.getElementById("+JSString(id)+").value")
}

// FakeClock gives the page a wall clock of the test's own, at 0 ms, that moves only by
// AdvanceClock: the page's clock (app.js's wallNow) then reads it, so that a test can check what
// the page shows after so much real time without depending on how fast the machine is.
func (s Simulation) FakeClock() {
	s.t.Helper()
	s.Do("installing a fake wall clock", chromedp.Evaluate[chromedp.Void](`window.__fakeNow = 0; window.__sluiceNow = () => window.__fakeNow;`))
}

// AdvanceClock moves the fake wall clock (FakeClock) on by ms.
func (s Simulation) AdvanceClock(ms int) {
	s.t.Helper()
	s.Do("advancing the fake wall clock", chromedp.Evaluate[chromedp.Void](fmt.Sprintf("window.__fakeNow += %d", ms)))
}

// Running reports whether the virtual clock is running.
func (s Simulation) Running() bool {
	s.t.Helper()
	return Eval[string](s.Tab, "document.getElementById('play').textContent") == "Pause"
}

// WaitBuckets waits until the clock has passed at least n time buckets.
func (s Simulation) WaitBuckets(n int) {
	s.t.Helper()
	s.Wait(fmt.Sprintf("the clock to pass %d buckets", n), fmt.Sprintf("Number(document.getElementById('time').value) >= %d", n))
}

// WaitComplete waits until the summary table is that of the whole run of the scenario whose
// canonical query string is query, and returns it.
func (s Simulation) WaitComplete(query string) Summaries {
	s.t.Helper()
	s.Wait("the whole run of "+query, `(() => { const t = document.getElementById('summary');
		return t.dataset.complete === 'true' && t.dataset.query === `+JSString(query)+`; })()`)
	return s.Summaries()
}

// Summaries reads the summary table: algorithm → JSON field → the cell's text.
func (s Simulation) Summaries() Summaries {
	s.t.Helper()
	return Eval[Summaries](s.Tab, `(() => {
		const out = {};
		for (const tr of document.querySelectorAll('#summary tbody tr')) {
			const row = {};
			for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
			out[tr.dataset.algorithm] = row;
		}
		return out;
	})()`)
}

// Summaries are the summary of each algorithm's run: algorithm → field → number as text.
type Summaries map[string]map[string]string

// SummariesFromJSON reads the summaries of `sluice simulate --compare --format json` output,
// keeping each number's text exactly as written.
func SummariesFromJSON(t testing.TB, out string) Summaries {
	t.Helper()
	var doc struct {
		Runs []struct {
			Algorithm string                     `json:"algorithm"`
			Summary   map[string]json.RawMessage `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("the command's JSON: %v\n%s", err, out)
	}
	sums := Summaries{}
	for _, r := range doc.Runs {
		sums[r.Algorithm] = map[string]string{}
		for k, v := range r.Summary {
			sums[r.Algorithm][k] = string(v)
		}
	}
	return sums
}

// Diff says how got differs from want, or "" if it does not.
func (want Summaries) Diff(got Summaries) string {
	var b strings.Builder
	for alg, fields := range want {
		for k, v := range fields {
			if g, ok := got[alg][k]; !ok || g != v {
				fmt.Fprintf(&b, "%s %s: page %q, want %q\n", alg, k, g, v)
			}
		}
		if len(got[alg]) != len(fields) {
			fmt.Fprintf(&b, "%s: page has fields %v, want %v\n", alg, keys(got[alg]), keys(fields))
		}
	}
	if len(got) != len(want) {
		fmt.Fprintf(&b, "page has algorithms %v, want %v\n", keys(got), keys(want))
	}
	return b.String()
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
