package llmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ClientCall is one call made by an official SDK (node/client.mjs).
type ClientCall struct {
	SDK string // "openai" or "anthropic"
	// API is, for openai, "chat" (the default), "completions", "responses" or "embeddings"; for
	// anthropic, "messages" (the default).
	API string
	// BaseURL is the server's URL without /v1 (the client adds it for the openai SDK).
	BaseURL string
	APIKey  string // default "test-key"
	Model   string // default "gpt-test" or "claude-test"
	// MaxTokens is the request's max_tokens (max_output_tokens for the Responses API); 0: none
	// (Anthropic's requires one: 16).
	MaxTokens int
	Stream    bool
	// IncludeUsage sets stream_options.include_usage on an openai stream.
	IncludeUsage bool
	// Headers are sent with the request: the X-Test-* headers of the upstream, a proxy's own.
	Headers map[string]string
	// MaxRetries is the SDK's maxRetries (0: none, unlike the SDKs' default of 2).
	MaxRetries int
	// Timeout is the SDK's timeout for each attempt (default 30 s).
	Timeout time.Duration
}

// ClientResult is what the SDK made of the call.
type ClientResult struct {
	OK   bool
	Text string // the completion as the SDK assembled it
	// Usage is the usage as the SDK reports it; nil when it reports none.
	Usage   *ClientUsage
	Vectors [][]float64 // embeddings
	// Status is the last HTTP status: the answer's, or the error's.
	Status int
	// ErrorType is the SDK's error class (RateLimitError, APIConnectionError…), ErrorCode the
	// error's code or type from the body (rate_limit_exceeded, rate_limit_error…).
	ErrorType, ErrorCode, ErrorMessage string
	// Attempts is the number of HTTP requests the SDK made, Statuses the status of each that got
	// an answer, Gaps the time from each attempt's start to the next one's.
	Attempts int
	Statuses []int
	Gaps     []time.Duration
}

// ClientUsage is a usage as an SDK reports it: OpenAI's chat and completions counts (prompt,
// completion), its Responses API's and Anthropic's (input, output), and the cache counts.
type ClientUsage struct {
	PromptTokens, CompletionTokens, InputTokens, OutputTokens, TotalTokens int64
	// CachedTokens is OpenAI's prompt_tokens_details.cached_tokens or
	// input_tokens_details.cached_tokens.
	CachedTokens                                   int64
	CacheReadInputTokens, CacheCreationInputTokens int64
}

func (u *ClientUsage) UnmarshalJSON(b []byte) error {
	type details struct {
		Cached int64 `json:"cached_tokens"`
	}
	var v struct {
		Prompt      int64    `json:"prompt_tokens"`
		Completion  int64    `json:"completion_tokens"`
		Input       int64    `json:"input_tokens"`
		Output      int64    `json:"output_tokens"`
		Total       int64    `json:"total_tokens"`
		PromptDet   *details `json:"prompt_tokens_details"`
		InputDet    *details `json:"input_tokens_details"`
		CacheRead   *int64   `json:"cache_read_input_tokens"`
		CacheCreate *int64   `json:"cache_creation_input_tokens"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*u = ClientUsage{PromptTokens: v.Prompt, CompletionTokens: v.Completion, InputTokens: v.Input, OutputTokens: v.Output, TotalTokens: v.Total}
	for _, d := range []*details{v.PromptDet, v.InputDet} {
		if d != nil {
			u.CachedTokens = d.Cached
		}
	}
	if v.CacheRead != nil {
		u.CacheReadInputTokens = *v.CacheRead
	}
	if v.CacheCreate != nil {
		u.CacheCreationInputTokens = *v.CacheCreate
	}
	return nil
}

// NodeDir returns the directory of the Node clients (package.json, client.mjs).
func NodeDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "node")
}

// ensure installs the SDKs once per test binary.
var ensure = sync.OnceValues(ensureNode)

// EnsureNode makes sure the SDKs are installed: it runs `npm ci` in NodeDir when node_modules is
// missing or was installed from another package-lock.json. A failure is the test's failure:
// scripts/test.sh installs node and npm. Test binaries of several packages may run it at once: a
// lock file serialises them.
func EnsureNode(t testing.TB) {
	t.Helper()
	if out, err := ensure(); err != nil {
		t.Fatalf("llmtest: installing the SDKs (npm ci in %s; scripts/test.sh installs node and npm): %v\n%s", NodeDir(), err, out)
	}
}

func ensureNode() ([]byte, error) {
	dir := NodeDir()
	f, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)

	if installed(dir) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

// installed reports that node_modules holds what package-lock.json locks: npm records what it
// installed in node_modules/.package-lock.json, so whoever ran npm ci (scripts/test.sh, a
// developer, EnsureNode), the versions and integrity hashes of the two agree.
func installed(dir string) bool {
	type lock struct {
		Packages map[string]struct{ Version, Integrity string }
	}
	var want, have lock
	for _, l := range []struct {
		path string
		into *lock
	}{{"package-lock.json", &want}, {"node_modules/.package-lock.json", &have}} {
		b, err := os.ReadFile(filepath.Join(dir, l.path))
		if err != nil || json.Unmarshal(b, l.into) != nil {
			return false
		}
	}
	for path, p := range want.Packages {
		if path != "" && have.Packages[path] != p {
			return false
		}
	}
	return len(want.Packages) > 1
}

// RunClient makes the call with the official SDK under node, and returns what the SDK made of
// it. It fails the test if the client does not run or prints no result; an error of the call
// itself is in the result.
func RunClient(t testing.TB, c ClientCall) ClientResult {
	t.Helper()
	EnsureNode(t)
	arg, err := json.Marshal(map[string]any{
		"sdk": c.SDK, "api": c.API, "base_url": c.BaseURL, "api_key": c.APIKey, "model": c.Model,
		"max_tokens": c.MaxTokens, "stream": c.Stream, "include_usage": c.IncludeUsage,
		"headers": c.Headers, "max_retries": c.MaxRetries, "timeout_ms": c.Timeout.Milliseconds(),
	})
	if err != nil {
		t.Fatal(err)
	}
	arg = omitZero(arg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", string(arg))
	cmd.Dir = NodeDir()
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("llmtest: node client.mjs %s: %v\n%s%s", arg, err, stdout.Bytes(), stderr.Bytes())
	}
	var r struct {
		ClientResult
		Error  string    `json:"error_type"`
		Code   string    `json:"error_code"`
		Msg    string    `json:"error_message"`
		GapsMS []float64 `json:"gaps_ms"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("llmtest: node client.mjs %s printed %q: %v\n%s", arg, stdout.Bytes(), err, stderr.Bytes())
	}
	res := r.ClientResult
	res.ErrorType, res.ErrorCode, res.ErrorMessage = r.Error, r.Code, r.Msg
	for _, g := range r.GapsMS {
		res.Gaps = append(res.Gaps, time.Duration(g*float64(time.Millisecond)))
	}
	return res
}

// omitZero drops the members of a JSON object that are zero (0, false, "", null), so that the
// client takes its defaults for them.
func omitZero(b []byte) []byte {
	var m map[string]any
	json.Unmarshal(b, &m)
	for k, v := range m {
		if v == nil || v == false || v == "" || v == float64(0) {
			delete(m, k)
		}
	}
	b, _ = json.Marshal(m)
	return b
}

// cleanEnv is the environment without the SDKs' own variables (OPENAI_*, ANTHROPIC_*), so that
// nothing of the machine's configuration reaches a test's client.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPENAI_") && !strings.HasPrefix(kv, "ANTHROPIC_") {
			env = append(env, kv)
		}
	}
	return env
}
