package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/client"
)

// TestMain checks that no test leaves a goroutine behind: the Transport starts none, and every
// test closes its server (which closes the idle connections of its client).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// backend is a real HTTP server that counts the requests it receives.
type backend struct {
	*httptest.Server
	requests atomic.Int64
}

// serve starts a backend whose handler is told each request's number (from 1).
func serve(t *testing.T, handle func(n int64, w http.ResponseWriter, r *http.Request)) *backend {
	t.Helper()
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(b.requests.Add(1), w, r)
	}))
	t.Cleanup(b.Close)
	return b
}

// refuse answers the first times requests with status and, unless it is "", the Retry-After
// retryAfter, and a short body; then 200 "ok".
func refuse(times int64, status int, retryAfter string) func(int64, http.ResponseWriter, *http.Request) {
	return func(n int64, w http.ResponseWriter, r *http.Request) {
		if n > times {
			io.WriteString(w, "ok")
			return
		}
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "refused %d", n)
	}
}

// sleeper is a virtual Sleep: it records the waits asked for and returns at once.
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleeper) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeper) Waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

// get sends a GET to url through tr and returns the status, the Retry-After and the body.
func get(t *testing.T, ctx context.Context, tr http.RoundTripper, url string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// checkWaits checks that each wait is in [told, told·1.1), the default jitter.
func checkWaits(t *testing.T, waits []time.Duration, n int, told time.Duration) {
	t.Helper()
	if len(waits) != n {
		t.Fatalf("waited %d times (%v), want %d", len(waits), waits, n)
	}
	for i, w := range waits {
		if w < told || w >= told+told/10 {
			t.Errorf("wait %d = %v, want in [%v, %v)", i, w, told, told+told/10)
		}
	}
}

func TestRetriesUntilAllowed(t *testing.T) {
	b := serve(t, refuse(2, http.StatusTooManyRequests, "1"))
	s := &sleeper{}
	tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}

	status, _, body := get(t, context.Background(), tr, b.URL)
	if status != http.StatusOK || body != "ok" {
		t.Fatalf("got %d %q, want 200 \"ok\"", status, body)
	}
	if n := b.requests.Load(); n != 3 {
		t.Errorf("backend saw %d requests, want 3", n)
	}
	checkWaits(t, s.Waits(), 2, time.Second)
}

func TestMaxRetries(t *testing.T) {
	for _, c := range []struct {
		maxRetries int
		requests   int64
	}{
		{0, 1 + client.DefaultMaxRetries},
		{1, 2},
		{5, 6},
		{-1, 1},
	} {
		t.Run(strconv.Itoa(c.maxRetries), func(t *testing.T) {
			b := serve(t, refuse(1000, http.StatusTooManyRequests, "2"))
			s := &sleeper{}
			tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep, MaxRetries: c.maxRetries}

			status, retryAfter, body := get(t, context.Background(), tr, b.URL)
			// The last refusal reaches the caller whole: status, Retry-After and body.
			want := fmt.Sprintf("refused %d", c.requests)
			if status != http.StatusTooManyRequests || retryAfter != "2" || body != want {
				t.Errorf("got %d, Retry-After %q, body %q; want 429, \"2\", %q", status, retryAfter, body, want)
			}
			if n := b.requests.Load(); n != c.requests {
				t.Errorf("backend saw %d requests, want %d", n, c.requests)
			}
			checkWaits(t, s.Waits(), int(c.requests-1), 2*time.Second)
		})
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	// The server's Date and a Retry-After 3 seconds later: the wait is 3s whatever the client's
	// clock says.
	b := serve(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n > 1 {
			return
		}
		date := time.Now().UTC().Add(-time.Hour) // a server clock an hour behind the client's
		w.Header().Set("Date", date.Format(http.TimeFormat))
		w.Header().Set("Retry-After", date.Add(3*time.Second).Format(http.TimeFormat))
		w.WriteHeader(http.StatusTooManyRequests)
	})
	s := &sleeper{}
	tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}

	if status, _, _ := get(t, context.Background(), tr, b.URL); status != http.StatusOK {
		t.Fatalf("status %d, want 200", status)
	}
	checkWaits(t, s.Waits(), 1, 3*time.Second)
}

func TestJitter(t *testing.T) {
	const retries = 200
	b := serve(t, refuse(retries, http.StatusTooManyRequests, "10"))
	s := &sleeper{}
	tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep, MaxRetries: retries}

	if status, _, _ := get(t, context.Background(), tr, b.URL); status != http.StatusOK {
		t.Fatalf("status %d, want 200", status)
	}
	waits := s.Waits()
	checkWaits(t, waits, retries, 10*time.Second)
	// The jitter is spread over its range, not a constant: some waits in each half.
	var low, high int
	for _, w := range waits {
		if w < 10500*time.Millisecond {
			low++
		} else {
			high++
		}
	}
	if low < retries/5 || high < retries/5 {
		t.Errorf("%d waits in the lower half of the jitter, %d in the upper; want both ≥ %d", low, high, retries/5)
	}

	t.Run("none", func(t *testing.T) {
		b := serve(t, refuse(3, http.StatusTooManyRequests, "10"))
		s := &sleeper{}
		tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep, Jitter: -1}
		get(t, context.Background(), tr, b.URL)
		for _, w := range s.Waits() {
			if w != 10*time.Second {
				t.Errorf("wait %v, want exactly 10s", w)
			}
		}
	})
}

func TestMaxWaitExceeded(t *testing.T) {
	for _, c := range []struct {
		name       string
		maxWait    time.Duration
		retryAfter string
	}{
		{"default", 0, "31"},
		{"custom", 2 * time.Second, "3"},
		{"date", 0, time.Now().UTC().Add(time.Minute).Format(http.TimeFormat)},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := serve(t, refuse(1, http.StatusTooManyRequests, c.retryAfter))
			s := &sleeper{}
			tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep, MaxWait: c.maxWait}

			status, retryAfter, _ := get(t, context.Background(), tr, b.URL)
			if status != http.StatusTooManyRequests || retryAfter != c.retryAfter {
				t.Errorf("got %d with Retry-After %q, want 429 with %q", status, retryAfter, c.retryAfter)
			}
			if n := b.requests.Load(); n != 1 {
				t.Errorf("backend saw %d requests, want 1", n)
			}
			if w := s.Waits(); len(w) != 0 {
				t.Errorf("waited %v, want no wait", w)
			}
		})
	}
}

func TestDeadlineShorterThanRetryAfter(t *testing.T) {
	b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
	s := &sleeper{}
	tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()

	status, retryAfter, _ := get(t, ctx, tr, b.URL)
	if status != http.StatusTooManyRequests || retryAfter != "1" {
		t.Errorf("got %d with Retry-After %q, want the 429 with \"1\"", status, retryAfter)
	}
	if ctx.Err() != nil {
		t.Errorf("the deadline passed before the 429 came back: %v", ctx.Err())
	}
	if w := s.Waits(); len(w) != 0 {
		t.Errorf("waited %v, want no wait", w)
	}
	if n := b.requests.Load(); n != 1 {
		t.Errorf("backend saw %d requests, want 1", n)
	}

	t.Run("http.Client.Timeout", func(t *testing.T) {
		// The Client's timeout reaches the Transport as the request context's deadline.
		b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
		s := &sleeper{}
		c := &http.Client{Timeout: 500 * time.Millisecond, Transport: &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}}
		resp, err := c.Get(b.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || len(s.Waits()) != 0 {
			t.Errorf("got %d after waiting %v, want the 429 at once", resp.StatusCode, s.Waits())
		}
	})

	t.Run("longer", func(t *testing.T) {
		b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
		s := &sleeper{}
		tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if status, _, _ := get(t, ctx, tr, b.URL); status != http.StatusOK {
			t.Errorf("status %d, want 200", status)
		}
		checkWaits(t, s.Waits(), 1, time.Second)
	})
}

// TestRealTimer runs the default Sleep on a real 1-second Retry-After: the backend sees the retry
// no sooner than a second after the refused request.
func TestRealTimer(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	b := serve(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		refuse(1, http.StatusTooManyRequests, "1")(n, w, r)
	})
	c := client.New(b.Client().Transport)

	start := time.Now()
	resp, err := c.Get(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	elapsed := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) != 2 {
		t.Fatalf("backend saw %d requests, want 2", len(arrivals))
	}
	if gap := arrivals[1].Sub(arrivals[0]); gap < time.Second {
		t.Errorf("retried %v after the refused request, want ≥ 1s", gap)
	}
	t.Logf("retry %v after the refusal; %v in all", arrivals[1].Sub(arrivals[0]), elapsed)
}

// tracking is a Base that records every response body it hands out.
type tracking struct {
	base   http.RoundTripper
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.ReadCloser
	read   atomic.Int64
	eof    atomic.Bool
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

func (tr *tracking) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body := &trackedBody{ReadCloser: resp.Body}
	resp.Body = body
	tr.mu.Lock()
	tr.bodies = append(tr.bodies, body)
	tr.mu.Unlock()
	return resp, nil
}

func (tr *tracking) Bodies() []*trackedBody {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*trackedBody(nil), tr.bodies...)
}

func TestDiscardedBodiesClosed(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	b := serve(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "slow down")
		case 2: // a refusal with a body too long to drain
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, big)
		default:
			io.WriteString(w, "ok")
		}
	})
	base := &tracking{base: b.Client().Transport}
	s := &sleeper{}
	c := &http.Client{Transport: &client.Transport{Base: base, Sleep: s.Sleep}}

	resp, err := c.Get(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	bodies := base.Bodies()
	if len(bodies) != 3 {
		t.Fatalf("%d responses, want 3", len(bodies))
	}
	if small := bodies[0]; !small.closed.Load() || !small.eof.Load() {
		t.Errorf("first refusal: closed %v, read to the end %v; want both", small.closed.Load(), small.eof.Load())
	}
	if long := bodies[1]; !long.closed.Load() || long.read.Load() > 64<<10 {
		t.Errorf("long refusal: closed %v after reading %d bytes; want closed after at most 64 KiB",
			long.closed.Load(), long.read.Load())
	}
	if bodies[2].closed.Load() {
		t.Error("the response returned to the caller was closed")
	}
	if body, _ := io.ReadAll(resp.Body); string(body) != "ok" {
		t.Errorf("body %q, want \"ok\"", body)
	}
	resp.Body.Close()
}

func TestCancelDuringWait(t *testing.T) {
	b := serve(t, refuse(1, http.StatusTooManyRequests, "10"))
	base := &tracking{base: b.Client().Transport}
	c := client.New(base) // the real timer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := time.AfterFunc(50*time.Millisecond, cancel)
	defer stop.Stop()

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.URL, strings.NewReader("payload"))
	start := time.Now()
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want an error", resp.StatusCode)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned after %v: the wait did not end with the context", d)
	}
	if n := b.requests.Load(); n != 1 {
		t.Errorf("backend saw %d requests, want 1", n)
	}
	for i, body := range base.Bodies() {
		if !body.closed.Load() {
			t.Errorf("response %d not closed", i)
		}
	}

	t.Run("custom Sleep error", func(t *testing.T) {
		b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
		errStop := errors.New("stop")
		tr := &client.Transport{Base: b.Client().Transport,
			Sleep: func(context.Context, time.Duration) error { return errStop }}
		// The body made for the retry that is never sent is closed all the same, as a
		// RoundTripper must.
		req, _ := http.NewRequest(http.MethodPost, b.URL, strings.NewReader("payload"))
		var replays []*trackedBody
		req.GetBody = func() (io.ReadCloser, error) {
			body := &trackedBody{ReadCloser: io.NopCloser(strings.NewReader("payload"))}
			replays = append(replays, body)
			return body, nil
		}
		_, err := (&http.Client{Transport: tr}).Do(req)
		if !errors.Is(err, errStop) {
			t.Errorf("error %v, want the Sleep's", err)
		}
		if len(replays) != 1 || !replays[0].closed.Load() {
			t.Errorf("%d replayed bodies, want 1, closed", len(replays))
		}
	})
}

func TestBodyReplayed(t *testing.T) {
	const payload = `{"order": 42}`
	var mu sync.Mutex
	var got []string
	b := serve(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+string(body))
		mu.Unlock()
		if string(body) != payload {
			http.Error(w, "wrong body", http.StatusBadRequest)
			return
		}
		refuse(2, http.StatusTooManyRequests, "1")(n, w, r)
	})
	s := &sleeper{}
	c := &http.Client{Transport: &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}}

	for _, body := range []io.Reader{strings.NewReader(payload), bytes.NewReader([]byte(payload)), bytes.NewBufferString(payload)} {
		b.requests.Store(0)
		mu.Lock()
		got = nil
		mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, b.URL, body)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%T: status %d, want 200", body, resp.StatusCode)
		}
		mu.Lock()
		want := []string{"POST " + payload, "POST " + payload, "POST " + payload}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%T: backend received %q, want %q", body, got, want)
		}
		mu.Unlock()
	}
}

func TestNonReplayableBodyNotRetried(t *testing.T) {
	b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
	s := &sleeper{}
	c := &http.Client{Transport: &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}}

	// io.NopCloser hides the reader's type, so http.NewRequest cannot set GetBody.
	req, _ := http.NewRequest(http.MethodPost, b.URL, io.NopCloser(strings.NewReader("once")))
	if req.GetBody != nil {
		t.Fatal("GetBody set; the test needs a body that cannot be replayed")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || string(body) != "refused 1" {
		t.Errorf("got %d %q, want the 429 as it came", resp.StatusCode, body)
	}
	if n := b.requests.Load(); n != 1 {
		t.Errorf("backend saw %d requests, want 1", n)
	}
	if w := s.Waits(); len(w) != 0 {
		t.Errorf("waited %v, want no wait", w)
	}

	t.Run("GetBody fails", func(t *testing.T) {
		b := serve(t, refuse(1, http.StatusTooManyRequests, "1"))
		req, _ := http.NewRequest(http.MethodPost, b.URL, strings.NewReader("once"))
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || string(body) != "refused 1" {
			t.Errorf("got %d %q, want the 429 as it came", resp.StatusCode, body)
		}
	})
}

func TestServiceUnavailable(t *testing.T) {
	for _, c := range []struct {
		name       string
		retryAfter string
		want       int
		requests   int64
	}{
		{"without Retry-After", "", http.StatusServiceUnavailable, 1},
		{"with an invalid Retry-After", "later", http.StatusServiceUnavailable, 1},
		{"with Retry-After", "1", http.StatusOK, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := serve(t, refuse(1, http.StatusServiceUnavailable, c.retryAfter))
			s := &sleeper{}
			tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}
			if status, _, _ := get(t, context.Background(), tr, b.URL); status != c.want {
				t.Errorf("status %d, want %d", status, c.want)
			}
			if n := b.requests.Load(); n != c.requests {
				t.Errorf("backend saw %d requests, want %d", n, c.requests)
			}
		})
	}

	t.Run("other statuses", func(t *testing.T) {
		for _, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusForbidden} {
			b := serve(t, refuse(1, status, "1"))
			tr := &client.Transport{Base: b.Client().Transport, Sleep: (&sleeper{}).Sleep}
			if got, _, _ := get(t, context.Background(), tr, b.URL); got != status {
				t.Errorf("status %d, want %d not retried", got, status)
			}
		}
	})

	t.Run("custom Retryable", func(t *testing.T) {
		b := serve(t, refuse(2, http.StatusBadGateway, ""))
		s := &sleeper{}
		tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep,
			Retryable: func(resp *http.Response) bool { return resp.StatusCode == http.StatusBadGateway }}
		if status, _, _ := get(t, context.Background(), tr, b.URL); status != http.StatusOK {
			t.Errorf("status %d, want 200", status)
		}
		if n := len(s.Waits()); n != 2 {
			t.Errorf("waited %d times, want 2", n)
		}
	})
}

func TestBackoffWithoutRetryAfter(t *testing.T) {
	const retries = 8
	for _, c := range []struct {
		name string
		rand func() float64
	}{
		{"random", nil},
		{"highest", func() float64 { return 1 - 1e-12 }},
		{"lowest", func() float64 { return 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := serve(t, refuse(retries, http.StatusTooManyRequests, ""))
			s := &sleeper{}
			tr := &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep, MaxRetries: retries, Rand: c.rand,
				Backoff: client.Backoff{Base: 100 * time.Millisecond, Cap: time.Second}}
			if status, _, _ := get(t, context.Background(), tr, b.URL); status != http.StatusOK {
				t.Fatalf("status %d, want 200", status)
			}
			waits := s.Waits()
			if len(waits) != retries {
				t.Fatalf("waited %d times, want %d", len(waits), retries)
			}
			// Ceilings 100ms, 200ms, 400ms, 800ms, then the 1s cap.
			for i, w := range waits {
				ceiling := min(100*time.Millisecond<<i, time.Second)
				if w < 0 || w >= ceiling {
					t.Errorf("wait %d = %v, want in [0, %v)", i, w, ceiling)
				}
				if c.name == "highest" && w != ceiling-1 {
					t.Errorf("wait %d = %v, want %v", i, w, ceiling-1)
				}
				if c.name == "lowest" && w != 0 {
					t.Errorf("wait %d = %v, want 0", i, w)
				}
			}
		})
	}
}

// TestConcurrent shares one Transport between many goroutines, each retrying its own refusals;
// run under -race.
func TestConcurrent(t *testing.T) {
	const clients, refusals = 32, 2
	var mu sync.Mutex
	seen := map[string]int{}
	b := serve(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Client")
		mu.Lock()
		seen[id]++
		n := seen[id]
		mu.Unlock()
		if n <= refusals {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		io.WriteString(w, id)
	})
	s := &sleeper{}
	c := &http.Client{Transport: &client.Transport{Base: b.Client().Transport, Sleep: s.Sleep}}

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Go(func() {
			id := strconv.Itoa(i)
			req, _ := http.NewRequest(http.MethodPut, b.URL, strings.NewReader(id))
			req.Header.Set("X-Client", id)
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != id {
				errs <- fmt.Errorf("client %s: got %d %q", id, resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := b.requests.Load(); n != clients*(refusals+1) {
		t.Errorf("backend saw %d requests, want %d", n, clients*(refusals+1))
	}
	checkWaits(t, s.Waits(), clients*refusals, time.Second)
}

func TestTransportErrorNotRetried(t *testing.T) {
	b := serve(t, refuse(0, 0, ""))
	url := b.URL
	b.Close() // nothing listens there any more
	s := &sleeper{}
	c := &http.Client{Transport: &client.Transport{Sleep: s.Sleep}}
	if resp, err := c.Get(url); err == nil {
		resp.Body.Close()
		t.Fatal("no error from a closed server")
	}
	if w := s.Waits(); len(w) != 0 {
		t.Errorf("waited %v after a transport error, want no retry", w)
	}
}
