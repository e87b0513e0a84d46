package gateway_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
)

// BenchmarkShedOverload is docs/performance.md's figures for load shedding (scripts/bench-shed.sh runs
// it): an upstream with 8 workers, 10ms of work per request (800 requests/s at most; more wait
// in its queue), behind the fasthttp engine with and without load_shedding. The traffic is
// open-loop: 1s at 200 requests/s (healthy: the baseline), then 3s at 1500/s (almost twice what
// the upstream can do). It prints the latency of the answered requests (200) during the
// overload, p50 and p99, and how many were answered and shed.
func BenchmarkShedOverload(b *testing.B) {
	for range b.N {
		for _, shedding := range []bool{false, true} {
			r := overloadRun(b, shedding)
			name := "without load shedding"
			if shedding {
				name = "with load shedding   "
			}
			fmt.Printf("%s: p50 %6.1f ms  p99 %7.1f ms  answered %5d  shed (503) %5d  other %d\n",
				name, r.p50, r.p99, r.ok, r.shed, r.other)
			b.ReportMetric(r.p99, map[bool]string{false: "p99-ms-plain", true: "p99-ms-shed"}[shedding])
		}
	}
}

type overloadResult struct {
	p50, p99        float64
	ok, shed, other int
}

func overloadRun(b *testing.B, shedding bool) overloadResult {
	workers := make(chan struct{}, 8)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		workers <- struct{}{} // wait for a worker: the upstream's queue
		time.Sleep(10 * time.Millisecond)
		<-workers
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	yaml := "upstream: " + up.URL + "\n"
	if shedding {
		yaml += "load_shedding: {min_limit: 4, max_limit: 1000, window: 100ms, tolerance: 2, slack: 5ms}\n"
	}
	cfg, err := config.Parse([]byte(yaml), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	fs := srv.FastServer()
	go fs.Serve(ln)
	defer fs.Shutdown()
	url := "http://" + ln.Addr().String() + "/x"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}, Timeout: time.Minute}

	var mu sync.Mutex
	var res overloadResult
	var lat []float64
	var wg sync.WaitGroup
	send := func(measure bool) {
		defer wg.Done()
		start := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			if measure {
				mu.Lock()
				res.other++
				mu.Unlock()
			}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !measure {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch resp.StatusCode {
		case http.StatusOK:
			res.ok++
			lat = append(lat, float64(time.Since(start).Microseconds())/1000)
		case http.StatusServiceUnavailable:
			res.shed++
		default:
			res.other++
		}
	}
	// Open loop: every 10ms, as many as the rate owes by then, whatever the answers (a tick the
	// loaded machine skips is made up at the next).
	phase := func(perSecond int, d time.Duration, measure bool) {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start, sent, total := time.Now(), 0, int(d.Seconds()*float64(perSecond))
		for sent < total {
			owed := min(total, int(time.Since(start).Seconds()*float64(perSecond))+1)
			for ; sent < owed; sent++ {
				wg.Add(1)
				go send(measure)
			}
			<-tick.C
		}
	}
	phase(200, time.Second, false)
	phase(1500, 3*time.Second, true)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		res.p50, res.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return res
}
