package main

import (
	"encoding/csv"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// fleetArgs is a buggy partner sending 600 a minute and a normal one 20, against 100 a minute,
// on three instances.
func fleetArgs(extra ...string) []string {
	return append([]string{"simulate", "--algorithm", "fixed-window", "--limit", "100", "--period", "1m",
		"--traffic", "buggy: 600/min for 1m; normal: 20/min for 1m", "--instances", "3"}, extra...)
}

type summaryDoc struct {
	Offered  int64 `json:"offered"`
	Allowed  int64 `json:"allowed"`
	Refused  int64 `json:"refused"`
	Fallback *struct {
		Open, Local, Closed int64
	} `json:"fallback"`
}

type fleetDoc struct {
	Fleet struct {
		Instances   int             `json:"instances"`
		Store       string          `json:"store"`
		Balance     string          `json:"balance"`
		Draw        *uint64         `json:"draw"`
		LocalBudget json.RawMessage `json:"local_budget"`
		Outage      *struct {
			FromMs  float64 `json:"from_ms"`
			ToMs    float64 `json:"to_ms"`
			OnError string  `json:"on_error"`
		} `json:"outage"`
	} `json:"fleet"`
	Requests []struct {
		Key      string `json:"key"`
		Allowed  bool   `json:"allowed"`
		Instance int    `json:"instance"`
		Fallback string `json:"fallback"`
	} `json:"requests"`
	Summary     summaryDoc `json:"summary"`
	PerInstance []struct {
		Instance int        `json:"instance"`
		Summary  summaryDoc `json:"summary"`
	} `json:"per_instance"`
	PerClient []struct {
		Key     string     `json:"key"`
		Summary summaryDoc `json:"summary"`
	} `json:"per_client"`
}

func fleetJSONOf(t *testing.T, args ...string) fleetDoc {
	t.Helper()
	var doc fleetDoc
	if err := json.Unmarshal([]byte(ok(t, "", append(args, "--format", "json")...)), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// On the same traffic, three instances with separate stores pass 300 of the buggy partner's
// requests to the backend where 100 a minute were meant; with a shared store, 100. The normal
// partner gets its 20 either way. The JSON's totals per instance and per client add up to its
// summary and its rows.
func TestSimulateStoreSeparateVersusShared(t *testing.T) {
	for _, tc := range []struct {
		store string
		buggy int64
	}{{"separate", 300}, {"shared", 100}} {
		doc := fleetJSONOf(t, fleetArgs("--store", tc.store)...)
		if doc.Fleet.Instances != 3 || doc.Fleet.Store != tc.store || doc.Fleet.Balance != "round-robin" || doc.Fleet.Draw != nil ||
			doc.Fleet.LocalBudget != nil || doc.Fleet.Outage != nil {
			t.Errorf("--store %s: fleet %+v", tc.store, doc.Fleet)
		}
		if len(doc.PerClient) != 2 || doc.PerClient[0].Key != "buggy" || doc.PerClient[1].Key != "normal" {
			t.Fatalf("--store %s: per_client %+v", tc.store, doc.PerClient)
		}
		if b, n := doc.PerClient[0].Summary, doc.PerClient[1].Summary; b.Offered != 600 || b.Allowed != tc.buggy || n.Offered != 20 || n.Allowed != 20 {
			t.Errorf("--store %s: buggy %+v, normal %+v; want %d of 600 and 20 of 20 allowed", tc.store, b, n, tc.buggy)
		}
		if doc.Summary.Offered != 620 || doc.Summary.Allowed != tc.buggy+20 || doc.Summary.Fallback != nil {
			t.Errorf("--store %s: summary %+v", tc.store, doc.Summary)
		}
		perInstance := map[int]int64{}
		for i, r := range doc.Requests {
			if r.Instance != i%3+1 {
				t.Fatalf("--store %s: request %d went to instance %d; want %d (round robin)", tc.store, i+1, r.Instance, i%3+1)
			}
			if r.Allowed {
				perInstance[r.Instance]++
			}
		}
		var total int64
		for i, s := range doc.PerInstance {
			if s.Instance != i+1 || s.Summary.Allowed != perInstance[i+1] {
				t.Errorf("--store %s: per_instance %d %+v; the rows say %d allowed", tc.store, i, s, perInstance[i+1])
			}
			total += s.Summary.Allowed
		}
		if len(doc.PerInstance) != 3 || total != doc.Summary.Allowed {
			t.Errorf("--store %s: %d instances allowing %d in all; the summary says %d", tc.store, len(doc.PerInstance), total, doc.Summary.Allowed)
		}

		// The table says the same, beside one instance.
		out := ok(t, "", fleetArgs("--store", tc.store)...)
		for _, want := range []string{
			`(?m)^fleet: 3 instances behind a load balancer, requests dealt in turn \(round robin\), `,
			`(?m)^one instance +620 +120 `,
			`(?m)^3 × ` + tc.store + ` stores? +620 +` + itoa(tc.buggy+20) + ` `,
			`(?m)^buggy +600 +100 +500 +` + itoa(tc.buggy) + ` +` + itoa(600-tc.buggy) + `$`,
			`(?m)^normal +20 +20 +0 +20 +0$`,
			`(?m)^passed to the backend per instance \(3 × ` + tc.store + ` stores?\): 1: \d+ 2: \d+ 3: \d+$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("--store %s: the table has no line matching %s:\n%s", tc.store, want, out)
			}
		}
	}
	// Random balance: the same numbers (each instance still sees over 100 of the buggy partner's).
	doc := fleetJSONOf(t, fleetArgs("--store", "separate", "--balance", "random", "--draw", "42")...)
	if doc.Fleet.Balance != "random" || doc.Fleet.Draw == nil || *doc.Fleet.Draw != 42 || doc.PerClient[0].Summary.Allowed != 300 {
		t.Errorf("random: fleet %+v, buggy %+v", doc.Fleet, doc.PerClient[0].Summary)
	}
}

// An outage of the shared store in the second minute: each instance answers with --on-error.
func TestSimulateStoreOutage(t *testing.T) {
	args := []string{"simulate", "--algorithm", "fixed-window", "--limit", "100", "--period", "1m",
		"--traffic", "a: 5/s for 3m", "--instances", "3", "--store", "shared", "--outage", "1m-2m"}
	for _, tc := range []struct {
		mode                string
		allowed             int64
		open, local, closed int64
	}{
		{"open", 500, 300, 0, 0},
		{"closed", 200, 0, 0, 300},
		{"local", 299, 0, 300, 0}, // 100 + 3 × 33 + 100
	} {
		a := append(append([]string{}, args...), "--on-error", tc.mode)
		doc := fleetJSONOf(t, a...)
		fb := doc.Summary.Fallback
		if doc.Summary.Allowed != tc.allowed || fb == nil || fb.Open != tc.open || fb.Local != tc.local || fb.Closed != tc.closed {
			t.Errorf("--on-error %s: summary %+v, fallback %+v", tc.mode, doc.Summary, fb)
		}
		if o := doc.Fleet.Outage; o == nil || o.FromMs != 60000 || o.ToMs != 120000 || o.OnError != tc.mode {
			t.Errorf("--on-error %s: outage %+v", tc.mode, o)
		}
		recs, err := csv.NewReader(strings.NewReader(ok(t, "", append(a, "--format", "csv")...))).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(recs[0], ","); got != "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,instance,fallback" {
			t.Fatalf("CSV header %s", got)
		}
		if recs[1][8] != "" || recs[301][8] != tc.mode || recs[601][8] != "" {
			t.Errorf("--on-error %s: fallback at 0, 60s, 120s: %q %q %q", tc.mode, recs[1][8], recs[301][8], recs[601][8])
		}
		out := ok(t, "", a...)
		if want := "decided without the store in the outage: 300 "; !strings.Contains(out, want) {
			t.Errorf("--on-error %s: the table does not say %q:\n%s", tc.mode, want, out)
		}
	}
}

func TestSimulateStoreBadFlags(t *testing.T) {
	base := []string{"simulate", "--algorithm", "fixed-window", "--limit", "100", "--period", "1m", "--traffic", "a: 1 at once"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "both"}, "--store both: want separate"},
		{[]string{"--store", "shared", "--instances", "0"}, "--instances 0: must be from 1 to 64"},
		{[]string{"--store", "shared", "--balance", "least-conn"}, "--balance least-conn: want round-robin or random"},
		{[]string{"--store", "shared", "--draw", "3"}, "--draw needs --balance random"},
		{[]string{"--balance", "random"}, "--balance needs --store"},
		{[]string{"--outage", "1m-2m"}, "--outage needs --store"},
		{[]string{"--store", "separate", "--outage", "1m-2m"}, "--outage 1m-2m needs --store shared"},
		{[]string{"--store", "shared", "--on-error", "open"}, "--on-error needs --outage"},
		{[]string{"--store", "shared", "--outage", "1m"}, "--outage 1m: want FROM-TO"},
		{[]string{"--store", "shared", "--outage", "2m-1m"}, "--outage 2m-1m: the outage must end after it begins"},
		{[]string{"--store", "shared", "--outage", "x-1m"}, `--outage x-1m: "x" is not a Go duration`},
		{[]string{"--store", "shared", "--outage", "0s-1m", "--on-error", "maybe"}, "--on-error maybe: want open, closed or local"},
		{[]string{"--store", "separate", "--local-budget", "5"}, "--local-budget needs --store shared"},
		{[]string{"--store", "shared", "--budget-max-age", "1s"}, "--budget-max-age needs --local-budget"},
		{[]string{"--traffic", "a: 1 at once; a: 2 at once"}, `client "a" is named twice`},
		{[]string{"--store-latency", "1ms"}, "--store-latency needs --store"},
		{[]string{"--store", "separate", "--store-latency", "1ms"}, "--store-latency 1ms needs --store shared"},
		{[]string{"--store", "shared", "--store-latency", "-1ms"}, "--store-latency -1ms: must be from 0 to 1h"},
		{[]string{"--store", "shared", "--store-latency", "1500ns"}, "--store-latency 1500ns: must be a whole number of microseconds"},
	} {
		code, _, stderr := runCLI(t, "", append(append([]string{}, base...), tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// --compare with --store runs every algorithm on the fleet: each run has its per_instance and
// per_client totals, as the browser page shows them.
func TestSimulateStoreCompare(t *testing.T) {
	var doc struct {
		Runs []fleetDoc `json:"runs"`
	}
	out := ok(t, "", "simulate", "--compare", "--limit", "100", "--period", "1m", "--traffic", "buggy: 600/min for 1m; normal: 20/min for 1m",
		"--instances", "3", "--store", "separate", "--format", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Runs) != 5 {
		t.Fatalf("%d runs", len(doc.Runs))
	}
	for _, r := range doc.Runs {
		if r.Fleet.Store != "separate" || len(r.PerInstance) != 3 || len(r.PerClient) != 2 || r.PerClient[1].Summary.Allowed != 20 {
			t.Errorf("run %+v", r.Fleet)
		}
	}
	if doc.Runs[0].PerClient[0].Summary.Allowed != 300 { // fixed-window: 100 on each instance
		t.Errorf("fixed-window: buggy allowed %d; want 300", doc.Runs[0].PerClient[0].Summary.Allowed)
	}
	table := ok(t, "", "simulate", "--compare", "--limit", "100", "--period", "1m", "--traffic", "buggy: 600/min for 1m; normal: 20/min for 1m",
		"--instances", "3", "--store", "separate")
	if !regexp.MustCompile(`(?m)^passed to the backend per instance \(fixed-window\): 1: 106 2: 107 3: 107$`).MatchString(table) {
		t.Errorf("the table:\n%s", table)
	}
}

// --store-latency: the table ends with the fleet's waits for the store, the same totals as its
// summary (one 2ms round trip for each of the 620 requests).
func TestSimulateStoreLatencyTable(t *testing.T) {
	out := ok(t, "", fleetArgs("--store", "shared", "--store-latency", "2ms")...)
	if want := "\nwaiting for the store: 1.24s in all, 2ms a request on average, at most 2ms\n"; !strings.Contains(out, want) {
		t.Errorf("the table does not say %q:\n%s", want, out)
	}
	doc := fleetJSONOf(t, fleetArgs("--store", "shared", "--store-latency", "2ms")...)
	if doc.Summary.Offered != 620 {
		t.Errorf("summary %+v", doc.Summary)
	}
}
