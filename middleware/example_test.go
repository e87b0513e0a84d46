package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/store/memory"
)

// Each tenant's contract per request, health checks left alone, and a refusal in the
// application's own words (the RateLimit fields and Retry-After are set for it).
func Example() {
	lim, _ := sluice.New(memory.New()) // no policy of its own: each request brings its own
	plans := map[string][]sluice.Limit{
		"free": {{Policy: sluice.Policy{Name: "free", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}}},
		"pro":  {{Policy: sluice.Policy{Name: "pro", Algorithm: sluice.FixedWindow, Limit: 1000, Period: time.Hour}}},
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(middleware.New(lim,
		middleware.KeyFunc(func(r *http.Request) (string, error) { return "tenant:" + r.Header.Get("X-Tenant"), nil }),
		middleware.Limits(func(r *http.Request) []sluice.Limit { return plans[r.Header.Get("X-Plan")] }),
		middleware.Exempt(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		middleware.OnRefused(func(w http.ResponseWriter, r *http.Request, info middleware.Refusal) {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "plan %q allows no more now", info.Refusing[0].Policy.Name)
		}))(api))
	defer srv.Close()

	get := func(path, tenant, plan string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("X-Plan", plan)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %s: %d %s, fields %v, Retry-After %v\n", tenant, path, resp.StatusCode, body,
			resp.Header.Get("RateLimit-Policy") != "", resp.Header.Get("Retry-After") != "")
	}
	get("/orders", "acme", "free")
	get("/orders", "acme", "free")
	get("/healthz", "acme", "free")
	get("/orders", "globex", "pro")
	// Output:
	// acme /orders: 200 ok, fields true, Retry-After false
	// acme /orders: 429 plan "free" allows no more now, fields true, Retry-After true
	// acme /healthz: 200 ok, fields false, Retry-After false
	// globex /orders: 200 ok, fields true, Retry-After false
}
