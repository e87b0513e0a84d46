package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
)

// Load shedding on the real binary: with its one slot held (the upstream holds a request until
// the test lets it go), an anonymous request is answered 503 temporary-reduced-capacity, and
// /v1/stats, the metrics and the operator page (Chromium) show the limit, the request in flight
// and the one shed; once the held one has answered, requests pass again.
func TestServeE2ELoadShedding(t *testing.T) {
	t.Parallel()
	arrived, gate := make(chan struct{}, 4), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			arrived <- struct{}{}
			<-gate
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(func() { open(); up.Close() })
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
load_shedding: {min_limit: 1, max_limit: 1, retry_after: 3s}
`, listen, admin, up.URL)
	})
	// The held request ends when the test lets it go, never on a timer: e2eClient's timeout would
	// end it (and free its slot) if the rest of the test, Chromium's start on a busy machine
	// included, took longer. A client without one, the request cancelled when the test ends.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	held := make(chan reply, 1)
	go func() {
		r := reply{status: -1}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.proxy+"/held", nil)
		if err == nil {
			var resp *http.Response
			if resp, err = (&http.Client{}).Do(req); err == nil {
				r.status, r.header = resp.StatusCode, resp.Header
				r.body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		}
		if err != nil {
			r.body = []byte(err.Error())
		}
		held <- r
	}()
	select {
	case <-arrived:
	case r := <-held:
		t.Fatalf("the held request ended before it reached the upstream: %d %s", r.status, r.body)
	case <-time.After(10 * time.Second):
		t.Fatal("the held request did not reach the upstream")
	}
	r := get(t, p.proxy, "/other")
	var prob struct {
		Type   string
		Status int
	}
	if err := json.Unmarshal(r.body, &prob); err != nil || r.status != 503 || prob.Status != 503 ||
		prob.Type != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" || r.header.Get("Retry-After") != "3" {
		t.Fatalf("with the one slot taken: %d %v %s", r.status, r.header, r.body)
	}
	st := get(t, p.admin, "/v1/stats")
	var stats gateway.Stats
	if err := json.Unmarshal(st.body, &stats); err != nil {
		t.Fatal(err)
	}
	if s := stats.LoadShedding; s == nil || s.Limit != 1 || s.InFlight != 1 || s.Shed["low"] != 1 || s.Admitted["low"] != 1 {
		t.Fatalf("/v1/stats load_shedding: %s", st.body)
	}
	if m := string(get(t, p.admin, "/metrics").body); !strings.Contains(m, "sluice_load_shed_total{priority=\"low\"} 1\n") ||
		!strings.Contains(m, "sluice_load_shedding_in_flight 1\n") || !strings.Contains(m, "sluice_load_shedding_limit 1\n") {
		t.Fatalf("metrics:\n%s", grepLines(m, "load_shed"))
	}

	tab := browsertest.NewTab(t, 1280, 800)
	tab.Do("open the operator page", chromedp.Navigate(p.admin+"/operator/"))
	tab.Wait("the load shedding section", `!document.getElementById("shedding").hidden`)
	if got := browsertest.Eval[string](tab, `document.getElementById("shedding-summary").textContent`); !strings.HasPrefix(got, "1 in flight of a limit of 1 (its maximum") {
		t.Fatalf("the page's load shedding summary: %q", got)
	}
	if got := browsertest.Eval[[]string](tab, `[...document.querySelectorAll('#shedding-priorities tr[data-priority="low"] td')].map(td => td.textContent)`); len(got) != 3 || got[0] != "50%" || got[1] != "1" || got[2] != "1" {
		t.Fatalf("the page's low priority row (share, admitted, shed): %q", got)
	}
	tab.Screenshot("operator-load-shedding")

	open()
	if r := <-held; r.status != 200 {
		t.Fatalf("the held request: %d %s", r.status, r.body)
	}
	if r := get(t, p.proxy, "/after"); r.status != 200 {
		t.Fatalf("after the held one answered: %d", r.status)
	}
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
