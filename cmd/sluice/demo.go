package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
)

// The demo's bursts. 25 at once against the anonymous bucket (20 saved, one more a second) get 5
// refusals unless they take 5 s to arrive; 6 at once against the queue (one served, room for 5,
// 2 a second) get 5 held unless they arrive half a second apart. Neither outcome depends on a
// window's boundary or on how fast the machine is.
const (
	demoBurst = 25
	demoQueue = 6
)

func newDemoCommand() *cobra.Command {
	var proxy, admin string
	cmd := &cobra.Command{
		Use:   "demo [--proxy URL] [--admin URL]",
		Short: "send the running demo (sluice serve without --config) bursts that show a 429 and held requests, and say what came back",
		Long: `Send traffic to the demo that "sluice serve" runs without --config, and say what came back,
on any machine however fast or busy:

  - 25 requests at once to /hello, as one anonymous client: its token bucket saves up to 20
    requests and gets one back a second, so 20 are answered and 5 refused 429 with Retry-After
    (a few more answered only if the 25 take seconds to arrive); with the RateLimit fields of
    the answers, explained;
  - 6 requests at once to /queue, a leaky bucket of 2 a second with room for 5 waiting: none is
    refused, one is answered at once and the others are held until their turn (0.5 s to 2.5 s);
    each answer's time, and how many the gateway held and how long in all, read from the admin
    listener's sluice_hold_seconds.

Start the demo first (sluice serve), then run this in another terminal; run it again after 20 s,
when the bucket is full again. --proxy and --admin are the demo's listeners when "sluice serve"
was given --listen or --admin-listen (it prints this command with them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := demoURL("--proxy", proxy)
			if err != nil {
				return err
			}
			var a *url.URL
			if admin != "" {
				if a, err = demoURL("--admin", admin); err != nil {
					return err
				}
			}
			return demoTraffic(cmd.OutOrStdout(), p, a)
		},
	}
	cmd.Flags().StringVar(&proxy, "proxy", "http://"+config.DefaultListen, "the demo proxy's `URL`")
	cmd.Flags().StringVar(&admin, "admin", "http://"+config.DefaultAdminListen, "the demo's admin listener's `URL`, asked how long the queue held requests (\"\": not asked)")
	return cmd
}

// demoURL is flag's value as the base URL of a listener, or an error naming the flag.
func demoURL(flag, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s %q: want an http or https URL, e.g. http://127.0.0.1:8080", flag, s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

// demoAnswer is one response of a burst: its status, the fields that explain it, and how long it
// took to come back.
type demoAnswer struct {
	status                int
	policy, fields, retry string // RateLimit-Policy, RateLimit, Retry-After
	took                  time.Duration
}

// demoTraffic sends the two bursts to the demo proxy and writes what came back to w; admin (nil:
// not asked) says how many of the queue's requests the gateway held, and how long.
func demoTraffic(w io.Writer, proxy, admin *url.URL) error {
	out := bufio.NewWriter(w)
	hello, err := burst(proxy.String()+"/hello", demoBurst)
	if err != nil {
		return err
	}
	writeHello(out, proxy.String()+"/hello", hello)
	fmt.Fprintln(out)
	if err := out.Flush(); err != nil { // seen while the queue holds the next burst
		return failure{err}
	}
	var before, after holds
	var adminErr error
	if admin != nil {
		before, adminErr = readHolds(admin.String())
	}
	queue, err := burst(proxy.String()+"/queue", demoQueue)
	if err != nil {
		return err
	}
	writeQueue(out, proxy.String()+"/queue", queue)
	if admin != nil && adminErr == nil {
		after, adminErr = readHolds(admin.String())
	}
	switch {
	case admin == nil:
	case adminErr != nil:
		fmt.Fprintf(out, "  (the admin listener, which says how long the gateway held them, did not answer: %v)\n", adminErr)
	default:
		fmt.Fprintf(out, "  The gateway held %d of them, %.2f s in all (sluice_hold_seconds on %s/metrics).\n",
			after.count-before.count, after.sum-before.sum, admin)
	}
	fmt.Fprintln(out, "  A leaky bucket does not refuse while its queue has room: it holds each request until its\n  turn, so that the backend sees an even stream.")
	if err := out.Flush(); err != nil {
		return failure{err}
	}
	return nil
}

// holds is the gateway's sluice_hold_seconds histogram: how many requests its leaky buckets held,
// and for how long in all.
type holds struct {
	count uint64
	sum   float64
}

// readHolds reads sluice_hold_seconds from the /metrics page of the admin listener at base.
func readHolds(base string) (holds, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return holds{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return holds{}, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	var h holds
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		switch {
		case !ok:
		case name == "sluice_hold_seconds_count":
			h.count, err = strconv.ParseUint(value, 10, 64)
			found++
		case name == "sluice_hold_seconds_sum":
			h.sum, err = strconv.ParseFloat(value, 64)
			found++
		}
		if err != nil {
			return holds{}, fmt.Errorf("%s/metrics: %s: %w", base, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return holds{}, err
	}
	if found != 2 {
		return holds{}, fmt.Errorf("%s/metrics has no sluice_hold_seconds", base)
	}
	return h, nil
}

// burst sends n GET requests to u at once (each on its own connection, all released together)
// and returns their answers, the fastest first. A request that gets no answer is the error: the
// demo is not running there.
func burst(u string, n int) ([]demoAnswer, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer c.CloseIdleConnections()
	answers := make([]demoAnswer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			resp, err := c.Get(u)
			if err != nil {
				errs[i] = err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			h := resp.Header
			answers[i] = demoAnswer{resp.StatusCode, h.Get("RateLimit-Policy"), h.Get("RateLimit"), h.Get("Retry-After"), time.Since(t0)}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, failure{fmt.Errorf("%w: is the demo running? Start it with `sluice serve` (no --config)", err)}
		}
	}
	slices.SortFunc(answers, func(a, b demoAnswer) int { return cmp.Compare(a.took, b.took) })
	return answers, nil
}

// The first member's values of the RateLimit fields.
var (
	qwRE = regexp.MustCompile(`;q=(\d+);w=(\d+)`)
	rtRE = regexp.MustCompile(`;r=(\d+);t=(\d+)`)
)

// writeHello says what the burst to /hello got: how many answered and refused, and the fields of
// the first answer and of a refusal, with what they mean.
func writeHello(w io.Writer, u string, as []demoAnswer) {
	var first, refused *demoAnswer
	for i, a := range as {
		switch {
		case a.status == http.StatusTooManyRequests:
			refused = &as[i]
		case a.status == http.StatusOK && (first == nil || remaining(a.fields) > remaining(first.fields)):
			first = &as[i] // the most left: the first one decided
		}
	}
	fmt.Fprintf(w, "%d requests at once to %s, from one address:\n  %s", len(as), u, statuses(as))
	if refused != nil {
		fmt.Fprintf(w, " (Retry-After: %s)", refused.retry)
	}
	fmt.Fprintln(w, ".")
	if first != nil && first.policy != "" {
		fmt.Fprintf(w, "  RateLimit-Policy: %s\n", first.policy)
		q := -1
		if m := qwRE.FindStringSubmatch(first.policy); m != nil {
			q, _ = strconv.Atoi(m[1])
			fmt.Fprintf(w, "      the policy: q=%s requests per w=%s seconds\n", m[1], m[2])
		}
		fmt.Fprintf(w, "  RateLimit: %s\n", first.fields)
		if m := rtRE.FindStringSubmatch(first.fields); m != nil {
			fmt.Fprintf(w, "      the first answer: r=%s requests left now, all back in t=%s s\n", m[1], m[2])
			if q >= 0 && remaining(first.fields) > q {
				fmt.Fprintln(w, "      r above q: a token bucket saves unused requests up to its burst (20 in the demo)\n      and gets q back every w seconds")
			}
		}
	}
	if refused != nil && refused.fields != "" {
		fmt.Fprintf(w, "  RateLimit: %s\n", refused.fields)
		if r := rtRE.FindStringSubmatch(refused.fields); r != nil {
			fmt.Fprintf(w, "      a 429: r=%s left, retry in t=%s s (as Retry-After says); the body says why\n", r[1], r[2])
		}
	}
}

// remaining is r of the first member of a RateLimit field; -1 if there is none.
func remaining(fields string) int {
	m := rtRE.FindStringSubmatch(fields)
	if m == nil {
		return -1
	}
	r, _ := strconv.Atoi(m[1])
	return r
}

// writeQueue says what the burst to /queue got: each answer's time, and the refusals.
func writeQueue(w io.Writer, u string, as []demoAnswer) {
	var took []string
	for _, a := range as {
		if a.status == http.StatusOK {
			took = append(took, fmt.Sprintf("%.2f s", a.took.Seconds()))
		}
	}
	fmt.Fprintf(w, "%d requests at once to %s, a leaky bucket:\n  %s.\n", len(as), u, statuses(as))
	if len(took) > 0 {
		fmt.Fprintf(w, "  Answered after %s.\n", strings.Join(took, ", "))
	}
}

// statuses counts the answers by status: "20 answered 200, 5 refused 429".
func statuses(as []demoAnswer) string {
	n := map[int]int{}
	for _, a := range as {
		n[a.status]++
	}
	var parts []string
	if n[http.StatusOK] > 0 {
		parts = append(parts, fmt.Sprintf("%d answered 200", n[http.StatusOK]))
	}
	if n[http.StatusTooManyRequests] > 0 {
		parts = append(parts, fmt.Sprintf("%d refused 429", n[http.StatusTooManyRequests]))
	} else {
		parts = append(parts, "none refused")
	}
	for _, code := range slices.Sorted(maps.Keys(n)) {
		if code != http.StatusOK && code != http.StatusTooManyRequests {
			parts = append(parts, fmt.Sprintf("%d answered %d", n[code], code))
		}
	}
	return strings.Join(parts, ", ")
}
