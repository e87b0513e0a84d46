package llmtest

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSDKs: the official SDKs, streaming and not, read from the fake upstream the text and the
// usage it sent, in one attempt: the fake is faithful to their parsers.
func TestSDKs(t *testing.T) {
	s := Start(t)
	text := Text(7, 5)
	hdr := map[string]string{"X-Test-Usage": "input=120,output=53,cached=20,write=30", "X-Test-Events": "7", "X-Test-Event-Bytes": "5"}
	chat := &ClientUsage{PromptTokens: 120, CompletionTokens: 53, TotalTokens: 173, CachedTokens: 20}
	responses := &ClientUsage{InputTokens: 120, OutputTokens: 53, TotalTokens: 173, CachedTokens: 20}
	for _, tc := range []struct {
		call ClientCall
		want *ClientUsage
	}{
		{ClientCall{SDK: "openai", API: "chat"}, chat},
		{ClientCall{SDK: "openai", API: "chat", Stream: true, IncludeUsage: true}, chat},
		{ClientCall{SDK: "openai", API: "chat", Stream: true}, nil}, // no usage unless asked for
		{ClientCall{SDK: "openai", API: "completions", MaxTokens: 9}, chat},
		{ClientCall{SDK: "openai", API: "completions", Stream: true, IncludeUsage: true}, chat},
		{ClientCall{SDK: "openai", API: "responses"}, responses},
		{ClientCall{SDK: "openai", API: "responses", Stream: true}, responses},
		{ClientCall{SDK: "anthropic"}, &ClientUsage{InputTokens: 70, OutputTokens: 53, CacheReadInputTokens: 20, CacheCreationInputTokens: 30}},
		{ClientCall{SDK: "anthropic", Stream: true, MaxTokens: 100}, &ClientUsage{InputTokens: 70, OutputTokens: 53, CacheReadInputTokens: 20, CacheCreationInputTokens: 30}},
	} {
		c := tc.call
		c.BaseURL, c.Headers = s.URL, hdr
		n := s.Count()
		r := RunClient(t, c)
		if !r.OK || r.Text != text || !reflect.DeepEqual(r.Usage, tc.want) || r.Attempts != 1 || r.Status != 200 {
			t.Errorf("%+v: got %+v (usage %+v), want text %q and usage %+v", tc.call, r, r.Usage, text, tc.want)
		}
		if reqs := s.Requests(); s.Count() != n+1 || strings.Contains(string(reqs[n].Body), `"stream":true`) != c.Stream ||
			strings.Contains(string(reqs[n].Body), `"include_usage":true`) != c.IncludeUsage || reqs[n].Header.Get("X-Test-Events") != "7" {
			t.Errorf("%+v: the upstream received %d requests, the last %s %v", tc.call, s.Count()-n, reqs[len(reqs)-1].Body, reqs[len(reqs)-1].Header)
		}
	}

	r := RunClient(t, ClientCall{SDK: "openai", API: "embeddings", BaseURL: s.URL, Headers: map[string]string{"X-Test-Usage": "input=9"}})
	want := [][]float64{{1, -0.5, 0.25, 0.125}, {2, -0.5, 0.25, 0.125}}
	if !r.OK || !reflect.DeepEqual(r.Vectors, want) || !reflect.DeepEqual(r.Usage, &ClientUsage{PromptTokens: 9, TotalTokens: 9}) {
		t.Errorf("embeddings: got %+v (usage %+v), want vectors %v", r, r.Usage, want)
	}
}

// TestSDKCut: a stream the upstream cuts short, or ends with an error event, is an error to both
// SDKs, not a short answer.
func TestSDKCut(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct{ sdk, hdr, code string }{
		{"openai", "X-Test-Cut", ""},
		{"anthropic", "X-Test-Cut", ""},
		{"openai", "X-Test-Error-After", "server_error"},
		{"anthropic", "X-Test-Error-After", "overloaded_error"},
	} {
		r := RunClient(t, ClientCall{SDK: tc.sdk, BaseURL: s.URL, Stream: true, IncludeUsage: true, Headers: map[string]string{tc.hdr: "3"}})
		if r.OK || r.Usage != nil || r.Attempts != 1 || r.ErrorCode != tc.code {
			t.Errorf("%s with %s: got %+v", tc.sdk, tc.hdr, r)
		}
		t.Logf("%s with %s: %s %q: %s", tc.sdk, tc.hdr, r.ErrorType, r.ErrorCode, r.ErrorMessage)
	}
}

// TestSDKRateLimit: a 429 in each provider's shape is the SDK's RateLimitError, with the body's
// error type, after one retry that waited what the headers said: retry-after-ms when there is
// one (over Retry-After), else Retry-After.
func TestSDKRateLimit(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct {
		sdk, code       string
		ms, secs        string
		least, lessThan time.Duration
	}{
		{"openai", "rate_limit_exceeded", "300", "5", 300 * time.Millisecond, 5 * time.Second},
		{"openai", "rate_limit_exceeded", "", "1", time.Second, time.Hour},
		{"anthropic", "rate_limit_error", "", "1", time.Second, time.Hour},
		{"anthropic", "rate_limit_error", "300", "5", 300 * time.Millisecond, 5 * time.Second},
	} {
		hdr := map[string]string{"X-Test-Error": "rate_limit", "X-Test-Retry-After": tc.secs}
		if tc.ms != "" {
			hdr["X-Test-Retry-After-Ms"] = tc.ms
		}
		n := s.Count()
		r := RunClient(t, ClientCall{SDK: tc.sdk, BaseURL: s.URL, MaxRetries: 1, Headers: hdr})
		if r.OK || r.ErrorType != "RateLimitError" || r.ErrorCode != tc.code || r.Status != 429 ||
			r.Attempts != 2 || !reflect.DeepEqual(r.Statuses, []int{429, 429}) || s.Count() != n+2 {
			t.Errorf("%s %v: got %+v, the upstream saw %d requests", tc.sdk, hdr, r, s.Count()-n)
			continue
		}
		if g := r.Gaps[0]; g < tc.least || g >= tc.lessThan {
			t.Errorf("%s %v: retried after %v, want at least %v and less than %v", tc.sdk, hdr, g, tc.least, tc.lessThan)
		}
	}
}
