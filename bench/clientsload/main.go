// Command clientsload drives the clients API for scripts/bench-clients.sh: it creates clients
// through one instance's API, concurrently (create), and measures how long a change made through
// one instance takes to run on others (propagate): for each probe it creates (or changes) a
// client through instance A and asks every other instance's decision API (POST /v1/check with the
// client's key) until it answers as that client under the expected policy, and prints the
// percentiles of the times from the write's start.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var client = &http.Client{Timeout: 10 * time.Second}

func main() {
	mode := flag.String("mode", "create", "create: make -n clients through -admin; propagate: -probes changes through -admin, seen on -others")
	admin := flag.String("admin", "", "the admin listener written to (http://host:port)")
	others := flag.String("others", "", "comma-separated admin listeners that must run each change (propagate)")
	token := flag.String("token", os.Getenv("SLUICE_ADMIN_TOKEN"), "the admin token")
	n := flag.Int("n", 10000, "clients to create")
	parallel := flag.Int("parallel", 16, "concurrent writers (create)")
	prefix := flag.String("prefix", "bench-client-", "client names and keys: PREFIX0, PREFIX1, ...")
	policy := flag.String("policy", "per-key", "the clients' policy")
	probes := flag.Int("probes", 200, "changes to time (propagate)")
	flag.Parse()
	switch *mode {
	case "create":
		create(*admin, *token, *prefix, *policy, *n, *parallel)
	case "propagate":
		propagate(*admin, strings.Split(*others, ","), *token, *prefix, *policy, *probes)
	default:
		fmt.Fprintln(os.Stderr, "clientsload: -mode create or propagate")
		os.Exit(2)
	}
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func put(admin, token, name, body string) error {
	req, _ := http.NewRequest("PUT", admin+"/v1/clients/"+name, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT %s: %s %s", name, resp.Status, b)
	}
	return nil
}

func create(admin, token, prefix, policy string, n, parallel int) {
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				name := fmt.Sprintf("%s%d", prefix, i)
				body := fmt.Sprintf(`{"api_key_sha256": %q, "policy": %q}`, sum(name), policy)
				if err := put(admin, token, name, body); err != nil {
					if failed.Add(1) <= 3 {
						fmt.Fprintln(os.Stderr, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Fprintf(os.Stderr, "clientsload: %d writes failed\n", failed.Load())
		os.Exit(1)
	}
	fmt.Printf("created %d clients in %.1f s (%.0f writes/s, %d writers)\n", n, time.Since(start).Seconds(), float64(n)/time.Since(start).Seconds(), parallel)
}

// seenAs reports whether admin's decision API takes key as client name with a limit of limit.
func seenAs(admin, token, key, name string, limit int64) bool {
	body, _ := json.Marshal(map[string]any{"api_key": key, "cost": 0})
	req, _ := http.NewRequest("POST", admin+"/v1/check", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var out struct {
		Client    string
		Decisions []struct{ Limit int64 }
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil {
		return false
	}
	return out.Client == name && len(out.Decisions) > 0 && out.Decisions[0].Limit == limit
}

func propagate(admin string, others []string, token, prefix, policy string, probes int) {
	var times []time.Duration
	for i := range probes {
		name := fmt.Sprintf("%sprobe-%d", prefix, i%20)
		limit := int64(1000 + i) // each probe a new limit: an override the others must run
		body := fmt.Sprintf(`{"api_key_sha256": %q, "policy": %q, "overrides": {%q: {"limit": %d}}}`, sum(name), policy, policy, limit)
		start := time.Now()
		if err := put(admin, token, name, body); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var wg sync.WaitGroup
		var worst atomic.Int64
		for _, o := range others {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !seenAs(o, token, name, name, limit) {
					if time.Since(start) > 30*time.Second {
						fmt.Fprintf(os.Stderr, "clientsload: %s never ran %s's limit %d\n", o, name, limit)
						os.Exit(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
				d := int64(time.Since(start))
				for {
					w := worst.Load()
					if d <= w || worst.CompareAndSwap(w, d) {
						break
					}
				}
			}()
		}
		wg.Wait()
		times = append(times, time.Duration(worst.Load()))
	}
	slices.Sort(times)
	q := func(p float64) time.Duration { return times[min(len(times)-1, int(p*float64(len(times))))] }
	fmt.Printf("propagation over %d changes (write through %s to every one of %d other instances running it): p50 %v, p90 %v, p99 %v, max %v\n",
		len(times), admin, len(others), q(0.5).Round(time.Millisecond), q(0.9).Round(time.Millisecond), q(0.99).Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
}
