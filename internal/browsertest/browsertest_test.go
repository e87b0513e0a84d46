package browsertest

import (
	"github.com/chromedp/chromedp"

	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// A tab records what a page writes to its console as an error, throws, or fails to load; and
// nothing of what it merely logs.
func TestTabRecordsConsoleProblems(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(`<!doctype html><title>t</title><link rel="icon" href="data:,">
<script>console.log("fine"); console.warn("also fine"); console.error("broken", 42);</script>
<script src="missing.js"></script>
<script>setTimeout(() => { throw new Error("thrown"); }); document.title = "done";</script>`))
	}))
	defer srv.Close()
	tab := NewTab(t, 800, 600)
	page := Simulation{Tab: tab}
	page.Do("loading", chromedp.Navigate(srv.URL))
	tab.Wait("the three problems", `document.title === "done"`)
	tab.Wait("the exception", `new Promise(r => setTimeout(() => r(true), 0))`)
	want := []string{"error: broken 42", "404", "Error: thrown"}
	var got []string
	for len(got) < len(want) {
		got = append(got, tab.TakeProblems()...)
		if len(got) < len(want) {
			tab.Wait("more messages", `new Promise(r => setTimeout(() => r(true), 10))`)
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, w) }) {
			t.Errorf("no problem like %q in %q", w, got)
		}
	}
	for _, g := range got {
		if strings.Contains(g, "fine") {
			t.Errorf("recorded %q, which is no problem", g)
		}
	}
}

func TestJSString(t *testing.T) {
	if got := JSString("a'b\\c\nd"); got != `'a\'b\\c\nd'` {
		t.Errorf("JSString: %s", got)
	}
}
