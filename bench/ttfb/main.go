// Command ttfb measures what sluice serve adds to a stream's time to first byte: an upstream of
// its own sends server-sent events (the first at once, the rest after a pause), and the command
// times the first event's arrival straight from the upstream and through a sluice serve (given by
// -sluice, started here on the memory store, with a limit that never refuses), alternately, and
// prints the medians and the 99th percentiles of both and their difference. It also checks that
// the stream passes unbuffered: the first event must arrive before the upstream sends the second.
//
//	go build -o /tmp/sluice ./cmd/sluice && go run ./bench/ttfb -sluice /tmp/sluice
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	bin := flag.String("sluice", "", "the sluice `binary` to measure (required)")
	n := flag.Int("n", 500, "requests `per target`")
	pause := flag.Duration("pause", 20*time.Millisecond, "the upstream's pause before its second event")
	flag.Parse()
	if *bin == "" {
		log.Fatal("ttfb: -sluice is required (go build -o /tmp/sluice ./cmd/sluice)")
	}

	up := listen()
	go func() {
		log.Fatal(http.Serve(up, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			fmt.Fprint(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(*pause) // the pause the stream's first event must not wait for
			fmt.Fprint(w, "data: second\n\n")
		})))
	}()

	dir, err := os.MkdirTemp("", "ttfb")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	proxy := listen()
	addr := proxy.Addr().String()
	proxy.Close()
	cfg := filepath.Join(dir, "sluice.yaml")
	yaml := fmt.Sprintf(`listen: %s
admin_listen: ""
upstream: http://%s
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: high, algorithm: token-bucket, limit: 100000000, period: 1s}
clients:
  - {name: bench, api_key_sha256: 1b32c28cb38c05480eccc1bd60ff97029b57a05c96718b96dad7e9d84894f549, policy: high}
`, addr, up.Addr())
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(*bin, "serve", "--config", cfg, "--watch", "0")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(15 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("ttfb: sluice serve did not listen within 15 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	targets := []struct{ name, url string }{{"direct", "http://" + up.Addr().String() + "/"}, {"sluice", "http://" + addr + "/"}}
	times := map[string][]time.Duration{}
	for i := 0; i < *n+20; i++ { // 20 warm-up rounds, not counted
		for _, t := range targets {
			d, err := firstEvent(client, t.url)
			if err != nil {
				log.Fatalf("ttfb: %s: %v", t.name, err)
			}
			if d >= *pause {
				log.Fatalf("ttfb: %s: the first event took %v, not before the upstream's pause of %v: the stream is buffered", t.name, d, *pause)
			}
			if i >= 20 {
				times[t.name] = append(times[t.name], d)
			}
		}
	}
	q := func(name string, p float64) time.Duration {
		s := slices.Clone(times[name])
		slices.Sort(s)
		return s[int(p*float64(len(s)-1))]
	}
	fmt.Printf("Time to the first event of a stream, %d requests each, alternating (the upstream pauses %v before its second)\n\n", *n, *pause)
	fmt.Println("| target | p50 | p99 |")
	fmt.Println("|---|---:|---:|")
	for _, t := range targets {
		fmt.Printf("| %s | %.3f ms | %.3f ms |\n", t.name, ms(q(t.name, 0.5)), ms(q(t.name, 0.99)))
	}
	fmt.Printf("\nsluice adds %.3f ms at p50 and %.3f ms at p99 (goal: within 1 ms at p50).\n",
		ms(q("sluice", 0.5)-q("direct", 0.5)), ms(q("sluice", 0.99)-q("direct", 0.99)))
}

// firstEvent returns how long the first event of url's stream took to arrive, and reads the rest.
func firstEvent(c *http.Client, url string) (time.Duration, error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-API-Key", "bench")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	took := time.Since(start)
	if err != nil || !strings.HasPrefix(line, "data: first") {
		return 0, fmt.Errorf("first line %q: %v", line, err)
	}
	for {
		if _, err := r.ReadString('\n'); err != nil {
			break
		}
	}
	return took, nil
}

func listen() net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	return l
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
