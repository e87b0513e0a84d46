// Command llmstream is the upstream and the client of the LLM streaming benchmark
// (scripts/bench-llm.sh):
//
//	llmstream upstream -listen ADDR
//	    serves the fake OpenAI and Anthropic API of the tests (internal/llmtest): streams of
//	    chat completion chunks whose length, event size and usage the request's X-Test-* headers
//	    choose.
//	llmstream streams -url URL -n 200 -events 1000 [-pid PID] [-label NAME]
//	    fetches n streamed chat completions of that many content events (with a final usage
//	    chunk), one at a time over one keep-alive connection, after a few not counted, and prints
//	    one JSON line: the time to the first event (p50, p99), the time to the stream's end (p50,
//	    p99) and, with -pid, that process's CPU time (utime + stime) per stream.
//	llmstream big -url URL -mb 1024 -event-bytes 4096 [-pid PID] [-metrics URL] [-label NAME]
//	    fetches one stream of about that many MiB, reading it as fast as it comes, and prints one
//	    JSON line: its bytes, time and throughput; with -pid, the process's CPU time and its RSS
//	    (VmRSS, sampled every -sample) before, at most during, and after it; with -metrics
//	    (sluice's /metrics), whether the stream's usage was settled exactly: the tokens
//	    sluice_llm_tokens_total grew by are the usage the stream reported.
//
// Every stream is checked whole: a status of 200, a first line that is an event, a last event
// "[DONE]" after the usage chunk with the usage asked for; anything else fails the command.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/llmtest"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("llmstream: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: llmstream upstream|streams|big [flags] (see the command's doc)")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "upstream: the `ADDR` to listen on")
	url := fs.String("url", "", "streams, big: the base `URL` to fetch from (without /v1)")
	key := fs.String("key", "bench-key", "streams, big: the API key sent as Authorization: Bearer")
	label := fs.String("label", "", "streams, big: the label of the JSON line")
	pid := fs.Int("pid", 0, "streams, big: the process whose CPU time (and RSS: big) to measure")
	n := fs.Int("n", 200, "streams: streams measured")
	warmup := fs.Int("warmup", 10, "streams: streams fetched first, not measured")
	events := fs.Int("events", 1000, "streams: content events per stream")
	interval := fs.Duration("interval", 0, "streams: the upstream's pause before each event (X-Test-Interval)")
	eventBytes := fs.Int("event-bytes", 0, "bytes of text per content event (default: streams 8, big 4096)")
	mb := fs.Int("mb", 1024, "big: the stream's size in MiB (of content: the chunks' JSON adds a little)")
	metrics := fs.String("metrics", "", "big: sluice's metrics `URL`, to check the usage was settled")
	sample := fs.Duration("sample", 10*time.Millisecond, "big: how often the RSS is sampled")
	fs.Parse(os.Args[2:])

	switch os.Args[1] {
	case "upstream":
		serve(*listen)
	case "streams":
		if *url == "" || *n < 1 || *events < 0 {
			log.Fatal("streams: -url is required, -n at least 1, -events at least 0")
		}
		size := *eventBytes
		if size == 0 {
			size = 8
		}
		c := client{url: *url, key: *key, interval: *interval}
		out := c.streams(*label, *n, *warmup, *events, size, *pid)
		printJSON(out)
	case "big":
		if *url == "" || *mb < 1 {
			log.Fatal("big: -url is required, -mb at least 1")
		}
		size := *eventBytes
		if size == 0 {
			size = 4096
		}
		c := client{url: *url, key: *key}
		printJSON(c.big(*label, *mb, size, *pid, *metrics, *sample))
	default:
		log.Fatalf("unknown command %q: upstream, streams or big", os.Args[1])
	}
}

// serve runs the fake LLM API on addr.
func serve(addr string) {
	srv := &http.Server{Addr: addr, Handler: llmtest.NewHandler(), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func printJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(b))
}

// client fetches streamed chat completions from url.
type client struct {
	url, key string
	interval time.Duration // the upstream's pause before each event
	http     http.Client
}

// Usage each stream reports (X-Test-Usage): a prompt of 100 tokens and one output token per
// content event, so a stream's output is its length in events.
const input = 100

// request is a streamed chat completion asking for the usage, for events content events of size
// bytes each.
func (c *client) request(events, size int) *http.Request {
	body := fmt.Sprintf(`{"model":"gpt-bench","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,`+
		`"messages":[{"role":"user","content":"Write a long story."}]}`, events)
	req, err := http.NewRequest(http.MethodPost, c.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	h := req.Header
	h.Set("Authorization", "Bearer "+c.key)
	h.Set("Content-Type", "application/json")
	h.Set("X-Test-Events", strconv.Itoa(events))
	h.Set("X-Test-Event-Bytes", strconv.Itoa(size))
	h.Set("X-Test-Usage", fmt.Sprintf("input=%d,output=%d", input, events))
	if c.interval > 0 {
		h.Set("X-Test-Interval", c.interval.String())
	}
	return req
}

// tail keeps the last bytes written to it, to check a stream's end.
type tail struct {
	buf []byte
	n   int64
}

func (t *tail) Write(p []byte) (int, error) {
	t.n += int64(len(p))
	const keep = 4 << 10
	if len(p) >= keep {
		t.buf = append(t.buf[:0], p[len(p)-keep:]...)
	} else {
		if over := len(t.buf) + len(p) - keep; over > 0 {
			t.buf = t.buf[:copy(t.buf, t.buf[over:])]
		}
		t.buf = append(t.buf, p...)
	}
	return len(p), nil
}

// check reports what is wrong with the end of a stream of events content events: it must end
// with the usage chunk and [DONE].
func (t *tail) check(events int) error {
	usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":%d,`, input, events)
	if !bytes.HasSuffix(t.buf, []byte("data: [DONE]\n\n")) || !bytes.Contains(t.buf, []byte(usage)) {
		return fmt.Errorf("the stream (%d bytes) does not end with the usage %s and [DONE]: ...%q", t.n, usage, t.buf[max(0, len(t.buf)-300):])
	}
	return nil
}

// fetch fetches one stream, read through r, and returns the times to its first event and to
// its end, and its bytes.
func (c *client) fetch(events, size int, r *bufio.Reader) (first, total time.Duration, n int64, err error) {
	req := c.request(events, size)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	r.Reset(resp.Body)
	line, err := r.ReadSlice('\n')
	first = time.Since(start)
	if err != nil || !bytes.HasPrefix(line, []byte("data: {")) {
		return 0, 0, 0, fmt.Errorf("the first line %q is not an event: %v", line, err)
	}
	var t tail
	if _, err := r.WriteTo(&t); err != nil {
		return 0, 0, 0, err
	}
	total = time.Since(start)
	if err := t.check(events); err != nil {
		return 0, 0, 0, err
	}
	return first, total, t.n + int64(len(line)), nil
}

// streamsResult is streams' JSON line; times in milliseconds, CPU -1 without -pid.
type streamsResult struct {
	Label          string  `json:"label"`
	Streams        int     `json:"streams"`
	Events         int     `json:"events"`
	BytesPerStream int64   `json:"bytes_per_stream"`
	FirstP50       float64 `json:"first_p50_ms"`
	FirstP99       float64 `json:"first_p99_ms"`
	TotalP50       float64 `json:"total_p50_ms"`
	TotalP99       float64 `json:"total_p99_ms"`
	CPUPerStream   float64 `json:"cpu_ms_per_stream"`
}

func (c *client) streams(label string, n, warmup, events, size, pid int) streamsResult {
	c.http.Transport = &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	r := bufio.NewReaderSize(nil, 64<<10)
	var firsts, totals []time.Duration
	var bytes int64
	var cpu0 time.Duration
	for i := range warmup + n {
		if i == warmup && pid > 0 {
			cpu0 = cpuTime(pid)
		}
		first, total, b, err := c.fetch(events, size, r)
		if err != nil {
			log.Fatalf("streams %s: stream %d: %v", label, i, err)
		}
		if i >= warmup {
			firsts, totals, bytes = append(firsts, first), append(totals, total), bytes+b
		}
	}
	out := streamsResult{Label: label, Streams: n, Events: events, BytesPerStream: bytes / int64(n),
		FirstP50: ms(quantile(firsts, 0.5)), FirstP99: ms(quantile(firsts, 0.99)),
		TotalP50: ms(quantile(totals, 0.5)), TotalP99: ms(quantile(totals, 0.99)), CPUPerStream: -1}
	if pid > 0 {
		out.CPUPerStream = ms(cpuTime(pid)-cpu0) / float64(n)
	}
	return out
}

// bigResult is big's JSON line; RSS in KiB, -1 without -pid; Settled is null without -metrics.
type bigResult struct {
	Label    string  `json:"label"`
	Bytes    int64   `json:"bytes"`
	Events   int     `json:"events"`
	Seconds  float64 `json:"seconds"`
	MiBPerS  float64 `json:"mib_per_s"`
	CPU      float64 `json:"cpu_s"`
	RSSStart int64   `json:"rss_start_kib"`
	RSSMax   int64   `json:"rss_max_kib"`
	RSSEnd   int64   `json:"rss_end_kib"`
	Samples  int     `json:"rss_samples"`
	Settled  *bool   `json:"settled"`
	// Input and Output are what sluice_llm_tokens_total grew by (input and output).
	Input  float64 `json:"input_tokens"`
	Output float64 `json:"output_tokens"`
}

func (c *client) big(label string, mb, size, pid int, metrics string, every time.Duration) bigResult {
	c.http.Transport = &http.Transport{DisableCompression: true}
	events := int((int64(mb) << 20) / int64(size))
	out := bigResult{Label: label, Events: events, CPU: -1, RSSStart: -1, RSSMax: -1, RSSEnd: -1}
	var before map[string]float64
	if metrics != "" {
		before = scrape(metrics)
	}
	var cpu0 time.Duration
	stop, sampled := make(chan struct{}), make(chan struct{})
	if pid > 0 {
		cpu0 = cpuTime(pid)
		out.RSSStart = rss(pid)
		out.RSSMax = out.RSSStart
		go func() { // the RSS while the stream passes
			defer close(sampled)
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					out.RSSMax = max(out.RSSMax, rss(pid))
					out.Samples++
				}
			}
		}()
	} else {
		close(sampled)
	}

	req := c.request(events, size)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		log.Fatalf("big %s: %v", label, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		log.Fatalf("big %s: status %d: %s", label, resp.StatusCode, b)
	}
	var t tail
	buf := make([]byte, 256<<10)
	for { // read as fast as the bytes come: the tail keeps 4 KiB
		n, err := resp.Body.Read(buf)
		t.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatalf("big %s: after %d bytes: %v", label, t.n, err)
		}
	}
	took := time.Since(start)
	resp.Body.Close()
	close(stop)
	<-sampled
	if err := t.check(events); err != nil {
		log.Fatalf("big %s: %v", label, err)
	}
	out.Bytes, out.Seconds = t.n, took.Seconds()
	out.MiBPerS = float64(t.n) / (1 << 20) / took.Seconds()
	if pid > 0 { // (before the scrapes below, which cost the process CPU)
		out.CPU = (cpuTime(pid) - cpu0).Seconds()
		out.RSSEnd = rss(pid)
	}

	if metrics != "" { // the settlement follows the stream's end: wait for it
		var after map[string]float64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			after = scrape(metrics)
			if after[settledKey] > before[settledKey] || time.Now().After(deadline) {
				break
			}
		}
		out.Input = after[inputKey] - before[inputKey]
		out.Output = after[outputKey] - before[outputKey]
		ok := after[settledKey] == before[settledKey]+1 && out.Input == input && out.Output == float64(events)
		out.Settled = &ok
	}
	return out
}

// The metrics big reads: the sums of these series over every label not named.
const (
	settledKey = `sluice_llm_requests_total outcome="settled"`
	inputKey   = `sluice_llm_tokens_total kind="input"`
	outputKey  = `sluice_llm_tokens_total kind="output"`
)

// scrape reads the metrics at url and returns the sums of big's series.
func scrape(url string) map[string]float64 {
	resp, err := http.Get(url)
	if err != nil {
		log.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		log.Fatalf("metrics: %s: status %d", url, resp.StatusCode)
	}
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, k := range []string{settledKey, inputKey, outputKey} {
			name, label, _ := strings.Cut(k, " ")
			if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err != nil {
					log.Fatalf("metrics: %q: %v", line, err)
				}
				sums[k] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		log.Fatalf("metrics: %v", err)
	}
	return sums
}

// clockTick is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// cpuTime is pid's CPU time so far, all its threads: utime + stime of /proc/<pid>/stat.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses and may hold spaces: the
	// state is the 3rd field, utime the 14th and stime the 15th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		log.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		log.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(u+s) * clockTick
}

// rss is pid's resident set size in KiB (VmRSS of /proc/<pid>/status).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				log.Fatalf("/proc/%d/status: %q", pid, line)
			}
			return kb
		}
	}
	log.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

func quantile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
