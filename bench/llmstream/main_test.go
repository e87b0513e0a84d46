package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/llmtest"
)

// TestTail: the tail keeps the last 4 KiB whatever the writes' sizes, and a stream is whole only
// if it ends with the usage asked for and [DONE].
func TestTail(t *testing.T) {
	var all []byte
	var tl tail
	for i, n := range []int{10, 3000, 5000, 1, 4096, 700} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		all = append(all, p...)
		tl.Write(p)
		if want := all[max(0, len(all)-4096):]; !bytes.Equal(tl.buf, want) || tl.n != int64(len(all)) {
			t.Fatalf("after %d writes: kept %d bytes of %d, want the last %d", i+1, len(tl.buf), tl.n, len(want))
		}
	}
	usage := `data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107}}` + "\n\n"
	for _, tc := range []struct {
		end string
		ok  bool
	}{
		{usage + "data: [DONE]\n\n", true},
		{usage, false}, // cut before [DONE]
		{strings.Replace(usage, ":7,", ":8,", 1) + "data: [DONE]\n\n", false}, // another usage
		{"data: [DONE]\n\n", false}, // none
	} {
		var tl tail
		tl.Write([]byte("data: {}\n\n"))
		tl.Write([]byte(tc.end))
		if err := tl.check(7); (err == nil) != tc.ok {
			t.Errorf("check(7) of a stream ending %q: %v, want ok %v", tc.end, err, tc.ok)
		}
	}
}

// TestStreams: streams fetches whole streams from the fake upstream, and measures them and the
// CPU of the process given (this one).
func TestStreams(t *testing.T) {
	up := httptest.NewServer(llmtest.NewHandler())
	defer up.Close()
	c := client{url: up.URL, key: "k", interval: 100 * time.Microsecond}
	out := c.streams("x", 5, 1, 20, 8, os.Getpid())
	if out.Streams != 5 || out.Events != 20 || out.BytesPerStream < 20*200 || out.FirstP50 <= 0 ||
		out.FirstP50 > out.TotalP50 || out.TotalP50 > out.TotalP99 || out.CPUPerStream < 0 {
		t.Errorf("got %+v", out)
	}
}

// TestBig: big reads a stream of the size asked for, samples the RSS of the process given (this
// one), and tells a settlement that matches the stream's usage from one that does not, waiting
// for it past the stream's end.
func TestBig(t *testing.T) {
	up := httptest.NewServer(llmtest.NewHandler())
	defer up.Close()
	for _, output := range []int{256, 255} {
		var scrapes atomic.Int32
		metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			settled, in, out := 3, 1000, 5000 // what came before
			if scrapes.Add(1) > 2 {           // settled after the second scrape past the stream
				settled, in, out = settled+1, in+100, out+output
			}
			fmt.Fprintf(w, "# HELP sluice_llm_requests_total x\n"+
				"sluice_llm_requests_total{client=\"bench\",model=\"none\",outcome=\"settled\"} %d\n"+
				"sluice_llm_requests_total{client=\"bench\",model=\"none\",outcome=\"no_usage\"} 9\n"+
				"sluice_llm_tokens_total{client=\"bench\",model=\"none\",kind=\"input\"} %d\n"+
				"sluice_llm_tokens_total{client=\"bench\",model=\"none\",kind=\"cached_input\"} 7\n"+
				"sluice_llm_tokens_total{client=\"bench\",model=\"none\",kind=\"output\"} %d\n", settled, in, out)
		}))
		c := client{url: up.URL, key: "k"}
		r := c.big("x", 1, 4096, os.Getpid(), metrics.URL, time.Millisecond)
		metrics.Close()
		if r.Events != 256 || r.Bytes < 1<<20 || r.MiBPerS <= 0 || r.RSSStart <= 0 || r.RSSMax < r.RSSStart || r.RSSEnd <= 0 || r.CPU < 0 {
			t.Errorf("output %d: got %+v", output, r)
		}
		if want := output == 256; r.Settled == nil || *r.Settled != want || r.Input != 100 || r.Output != float64(output) {
			t.Errorf("output %d: settled %v (input %v, output %v), want %v", output, r.Settled, r.Input, r.Output, want)
		}
	}
}
