package clients

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

func hash(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

const baseYAML = `listen: 127.0.0.1:0
upstream: http://127.0.0.1:1
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: standard, algorithm: fixed-window, limit: 5, period: 1m}
  - {name: burst, algorithm: token-bucket, limit: 10, period: 1s, burst: 20}
  - {name: anon, algorithm: fixed-window, limit: 100, period: 1m}
  - {name: per-path, algorithm: fixed-window, limit: 100, period: 1m, key_by: [path]}
default_policy: [anon]
routes:
  - {path_prefix: /bulk, cost: 4}
clients:
  - {name: premium-file, api_key_sha256: %q, policy: [standard]}
  - {name: acme, api_key_sha256: %q, policy: [standard]}
`

func baseConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(baseYAML, hash("file-key"), hash("file-acme-key"))), "sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// backends runs f on a MemoryBackend and on a real Redis's registry.
func backends(t *testing.T, f func(t *testing.T, b Backend)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		b, err := NewMemoryBackend(filepath.Join(t.TempDir(), "clients.journal"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		f(t, b)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f(t, redisBackend(t, redistest.Start(t).Addr))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		f(t, redisBackend(t, redistest.StartCluster(t, 3).Addrs()...))
	})
}

// redisBackend is the registry of a Redis store on addrs (one server, or a Cluster's nodes).
func redisBackend(t *testing.T, addrs ...string) Backend {
	st, err := redisstore.New(redisstore.Options{Addrs: addrs, Prefix: "t:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := st.Registry()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, err := b.Version(context.Background()); err == nil {
			return b
		} else if time.Now().After(deadline) {
			t.Fatalf("the registry never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBackendWrites: a write compares the revision (create-only, any, exact), a delete of
// nothing is ErrNotFound, Since lists what changed after a version (deletes with no data), and
// the audit is newest first, paged by version.
func TestBackendWrites(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		v1, err := b.Write(ctx, "client/a", 0, []byte(`{"x":1}`), []byte(`{"n":1}`))
		if err != nil || v1 != 1 {
			t.Fatalf("create: %d, %v; want version 1", v1, err)
		}
		if _, err := b.Write(ctx, "client/a", 0, []byte(`{"x":2}`), []byte(`{"n":2}`)); !errors.Is(err, ErrConflict) {
			t.Fatalf("create again: %v; want ErrConflict", err)
		}
		if _, err := b.Write(ctx, "client/a", 7, []byte(`{"x":2}`), []byte(`{"n":2}`)); !errors.Is(err, ErrConflict) {
			t.Fatalf("write at revision 7 of a record at 1: %v; want ErrConflict", err)
		}
		v2, err := b.Write(ctx, "client/b", -1, []byte(`{"x":3}`), []byte(`{"n":3}`))
		if err != nil || v2 != 2 {
			t.Fatalf("write any: %d %v", v2, err)
		}
		v3, err := b.Write(ctx, "client/a", v1, nil, []byte(`{"n":4}`))
		if err != nil || v3 != 3 {
			t.Fatalf("delete: %d %v", v3, err)
		}
		if _, err := b.Write(ctx, "client/zz", -1, nil, []byte(`{}`)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete of nothing: %v; want ErrNotFound", err)
		}
		es, at, err := b.Since(ctx, 1)
		if err != nil || at != 3 || len(es) != 2 {
			t.Fatalf("Since(1): %+v at %d, %v; want a (deleted) and b at 3", es, at, err)
		}
		for _, e := range es {
			switch e.Field {
			case "client/a":
				if e.Data != nil {
					t.Errorf("a deleted, yet Since gives %s", e.Data)
				}
			case "client/b":
				if string(e.Data) != `{"x":3}` || e.Rev != 2 {
					t.Errorf("b: %+v", e)
				}
			}
		}
		all, _, _ := b.Since(ctx, 0)
		if len(all) != 1 || all[0].Field != "client/b" {
			t.Errorf("Since(0): %+v; want b only", all)
		}
		au, err := b.Audit(ctx, 0, 10)
		if err != nil || len(au) != 3 || au[0].Version != 3 || string(au[0].Data) != `{"n":4}` || au[2].Version != 1 {
			t.Fatalf("audit: %+v %v; want versions 3, 2, 1", au, err)
		}
		older, _ := b.Audit(ctx, 3, 1)
		if len(older) != 1 || older[0].Version != 2 {
			t.Errorf("audit before 3, 1 entry: %+v; want version 2", older)
		}
	})
}

// TestMemoryJournal: the records survive a restart (the journal replayed); a last line cut short
// by a crash is dropped, and the journal is compacted.
func TestMemoryJournal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "clients.journal")
	b, err := NewMemoryBackend(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 50 {
		if _, err := b.Write(ctx, "client/a", -1, []byte(fmt.Sprintf(`{"i":%d}`, i)), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	b.Write(ctx, "client/b", -1, []byte(`{"b":1}`), []byte(`{}`))
	b.Close()
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"v":52,"f":"client/c","d":{"cut`) // a crash mid-write
	f.Close()
	b, err = NewMemoryBackend(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, _ := b.Get(ctx, "client/a")
	c, _ := b.Get(ctx, "client/c")
	if v, _, _ := b.Version(ctx); v != 51 || string(a.Data) != `{"i":49}` || a.Rev != 50 || c.Data != nil {
		t.Fatalf("after the restart: version %d, a %+v, c %+v; want 51, a's last write, no c", v, a, c)
	}
	if _, err := b.Write(ctx, "client/c", 0, []byte(`{"c":1}`), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if n := strings.Count(string(data), "\n"); n > 60 || strings.Contains(string(data), "cut") {
		t.Errorf("the journal has %d lines (or the cut one): not rewritten", n)
	}
	au, _ := b.Audit(ctx, 0, 100)
	if len(au) != 52 {
		t.Errorf("audit entries after the restart: %d; want 52", len(au))
	}
}

// testAPI is the API on backend b over base, served by an httptest server; writes are by
// "tester" with token "tok".
type testAPI struct {
	m    *Manager
	srv  *httptest.Server
	cfg  atomic.Pointer[config.Config]
	base *config.Config
}

func newTestAPI(t *testing.T, b Backend, base *config.Config) *testAPI {
	t.Helper()
	ta := &testAPI{m: NewManager(b, 10*time.Millisecond, nil), base: base}
	ta.cfg.Store(base)
	ta.m.SetApply(func() {
		cfg, err := ta.m.Merge(ta.base)
		if err != nil {
			t.Errorf("merge: %v", err)
			return
		}
		ta.cfg.Store(cfg)
	})
	if _, err := ta.m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	ta.m.Apply()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go ta.m.Run(ctx)
	api := &API{M: ta.m, Config: ta.cfg.Load, Base: func() *config.Config { return ta.base },
		Writer: func(r *http.Request) (string, string) {
			if r.Header.Get("Authorization") == "Bearer tok" {
				return "tester", ""
			}
			return "", "writes need the token"
		}}
	mux := http.NewServeMux()
	api.Mount(func(p string, h http.Handler) { mux.Handle(p, h) })
	ta.srv = httptest.NewServer(mux)
	t.Cleanup(ta.srv.Close)
	return ta
}

func (ta *testAPI) do(t *testing.T, method, path, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, ta.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// limitOf is the limit the running configuration gives client on policy (0: it has none).
func (ta *testAPI) limitOf(client, policy string) int64 {
	cfg := ta.cfg.Load()
	cl, ok := cfg.ClientByName(client)
	if !ok {
		return 0
	}
	for _, a := range cfg.AppliedPoliciesFor(cl, nil) {
		if a.PolicyName == policy {
			return a.Policy.Limit
		}
	}
	return 0
}

// TestConcurrentWritersNoLostUpdate: 16 writers each add their own metadata entry to one client
// by read, change, PUT with If-Match, again on 412: every entry is there at the end (no update
// lost), on both backends.
func TestConcurrentWritersNoLostUpdate(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ta := newTestAPI(t, b, baseConfig(t))
		if st, _, body := ta.do(t, "PUT", "/v1/clients/shared", fmt.Sprintf(`{"api_key_sha256": %q}`, hash("k"))); st != 201 {
			t.Fatalf("create: %d %s", st, body)
		}
		const writers = 16
		var wg sync.WaitGroup
		var conflicts atomic.Int64
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					st, h, body := ta.do(t, "GET", "/v1/clients/shared", "")
					if st != 200 {
						t.Errorf("GET: %d %s", st, body)
						return
					}
					var rec map[string]any
					json.Unmarshal([]byte(body), &rec)
					meta, _ := rec["metadata"].(map[string]any)
					if meta == nil {
						meta = map[string]any{}
					}
					meta[fmt.Sprintf("w%d", w)] = "x"
					rec["metadata"] = meta
					nb, _ := json.Marshal(rec)
					st, _, body = ta.do(t, "PUT", "/v1/clients/shared", string(nb), "If-Match", h.Get("ETag"))
					switch st {
					case 200:
						return
					case 412:
						conflicts.Add(1)
						continue
					default:
						t.Errorf("PUT: %d %s", st, body)
						return
					}
				}
			}()
		}
		wg.Wait()
		_, _, body := ta.do(t, "GET", "/v1/clients/shared", "")
		var rec struct{ Metadata map[string]string }
		json.Unmarshal([]byte(body), &rec)
		if len(rec.Metadata) != writers {
			t.Errorf("metadata after %d writers: %v; want every writer's entry", writers, rec.Metadata)
		}
		t.Logf("%d writes were refused 412 and made again", conflicts.Load())
	})
}

// TestBadWritesChangeNothing: each bad body is a 400 naming its field, and the registry's
// version does not move.
func TestBadWritesChangeNothing(t *testing.T) {
	t.Parallel()
	b, _ := NewMemoryBackend("")
	ta := newTestAPI(t, b, baseConfig(t))
	k := hash("x")
	cases := []struct{ path, body, field string }{
		{"/v1/clients/c1", `{"api_key_sha256": "abc"}`, "api_key_sha256[0]"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "nope"}`, k), "policy[0]"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": 3}`, k), "policy"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "polcy": "standard"}`, k), "polcy"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "standard", "overrides": {"standard": {"limit": -1}}}`, k), "overrides.standard.limit"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "standard", "overrides": {"standard": {"burst": 3}}}`, k), "overrides.standard.burst"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "standard", "overrides": {"standard": {"limit": 3}}}`, k), "overrides.standard.limit"}, // /bulk costs 4
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "standard", "overrides": {"burst": {"limit": 3}}}`, k), "overrides.burst"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "per-path", "overrides": {"per-path": {"limit": 3}}}`, k), "overrides.per-path"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q, "plan": "gold"}`, k), "plan"},
		{"/v1/clients/c1", fmt.Sprintf(`{"api_key_sha256": %q}`, hash("file-acme-key")), "api_key_sha256[0]"},
		{"/v1/clients/anonymous", fmt.Sprintf(`{"api_key_sha256": %q}`, k), "name"},
		{"/v1/clients/c1", `{"api_key_sha256": [` + strings.Repeat(`"`+k+`",`, 9) + `"` + k + `"]}`, "api_key_sha256[1]"},
		{"/v1/plans/p1", `{"policy": []}`, "policy"},
		{"/v1/overrides/premium-*", `{"overrides": {"nope": {"limit": 3}}}`, "overrides.nope"},
		{"/v1/overrides/premium-*", `{"overrides": {"standard": {"limit": 2}}}`, "overrides.standard.limit"}, // premium-file: /bulk costs 4
	}
	for _, c := range cases {
		st, _, body := ta.do(t, "PUT", c.path, c.body)
		var p struct{ Field, Detail string }
		json.Unmarshal([]byte(body), &p)
		if st != 400 || p.Field != c.field || !strings.Contains(p.Detail, "nothing was changed") {
			t.Errorf("PUT %s %s: %d %s; want 400 naming %s", c.path, c.body, st, body, c.field)
		}
	}
	if v, _, _ := b.Version(context.Background()); v != 0 {
		t.Errorf("the registry's version is %d after only bad writes; want 0", v)
	}
	// Without the token: refused, nothing changed.
	req, _ := http.NewRequest("PUT", ta.srv.URL+"/v1/clients/c1", strings.NewReader(fmt.Sprintf(`{"api_key_sha256": %q}`, k)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v, _, _ := b.Version(context.Background()); resp.StatusCode != http.StatusForbidden || v != 0 {
		t.Errorf("PUT without the token: %d, version %d; want 403 and 0", resp.StatusCode, v)
	}
}

// TestOverridePrecedence: per policy, the client's own override wins over a rule by exact name,
// which wins over a wildcard rule (more fixed characters first), which wins over the plan's; a
// file client is overridden by the rules too, and shadowed by an API client of its name.
func TestOverridePrecedence(t *testing.T) {
	t.Parallel()
	b, _ := NewMemoryBackend("")
	ta := newTestAPI(t, b, baseConfig(t))
	put := func(path, body string) {
		t.Helper()
		if st, _, out := ta.do(t, "PUT", path, body); st/100 != 2 {
			t.Fatalf("PUT %s: %d %s", path, st, out)
		}
	}
	put("/v1/plans/gold", `{"policy": ["standard", "burst"], "overrides": {"standard": {"limit": 50}, "burst": {"limit": 11}}}`)
	put("/v1/clients/premium-x", fmt.Sprintf(`{"api_key_sha256": %q, "plan": "gold"}`, hash("px")))
	put("/v1/clients/premium-own", fmt.Sprintf(`{"api_key_sha256": %q, "plan": "gold", "overrides": {"standard": {"limit": 70}}}`, hash("po")))
	put("/v1/clients/other", fmt.Sprintf(`{"api_key_sha256": %q, "plan": "gold"}`, hash("ot")))
	if got := ta.limitOf("premium-x", "standard"); got != 50 {
		t.Errorf("plan's override: %d; want 50", got)
	}
	put("/v1/overrides/*", `{"overrides": {"standard": {"limit": 55}}}`)
	put("/v1/overrides/premium-*", `{"overrides": {"standard": {"limit": 60}}}`)
	put("/v1/overrides/premium-x", `{"overrides": {"standard": {"limit": 65}}}`)
	for _, c := range []struct {
		client, policy string
		want           int64
	}{
		{"premium-x", "standard", 65},    // exact rule over the wildcard and the plan
		{"premium-own", "standard", 70},  // its own over every rule
		{"other", "standard", 55},        // "*" over the plan
		{"other", "burst", 11},           // the plan's, no rule for it
		{"premium-file", "standard", 60}, // a file client: the wildcard rule applies
		{"acme", "standard", 55},
	} {
		if got := ta.limitOf(c.client, c.policy); got != c.want {
			t.Errorf("%s's %s limit: %d; want %d", c.client, c.policy, got, c.want)
		}
	}
	// An API client named as a file client shadows it.
	put("/v1/clients/acme", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "burst"}`, hash("api-acme")))
	cl, _ := ta.cfg.Load().ClientByName("acme")
	if cl.Source != config.SourceAPI || ta.limitOf("acme", "burst") != 10 {
		t.Errorf("acme after the API's PUT: source %q; want the API's", cl.Source)
	}
	if st := ta.m.Status(); len(st.Shadowed) != 1 || st.Shadowed[0] != "acme" || st.FromFile != 1 || st.FromAPI != 4 {
		t.Errorf("status %+v; want acme shadowed, 1 from the file, 4 from the API", st)
	}
	// A plan that clients take cannot be deleted; a plan change that would not fit them is refused.
	if st, _, body := ta.do(t, "DELETE", "/v1/plans/gold", ""); st != http.StatusConflict {
		t.Errorf("DELETE a plan in use: %d %s; want 409", st, body)
	}
	if st, _, body := ta.do(t, "PUT", "/v1/plans/gold", `{"policy": ["burst"]}`); st != 400 || !strings.Contains(body, "premium-own") {
		t.Errorf("a plan change that leaves premium-own's override without its policy: %d %s; want 400 naming the client", st, body)
	}
	// Deleting the rules gives back the plan's.
	ta.do(t, "DELETE", "/v1/overrides/premium-x", "")
	ta.do(t, "DELETE", "/v1/overrides/premium-*", "")
	ta.do(t, "DELETE", "/v1/overrides/*", "")
	if got := ta.limitOf("premium-x", "standard"); got != 50 {
		t.Errorf("after the rules' deletes: %d; want the plan's 50", got)
	}
	if got := ta.limitOf("premium-file", "standard"); got != 5 {
		t.Errorf("the file client after the rules' deletes: %d; want the policy's 5", got)
	}
}

// TestExpiry: a client past its expires_at, and a key past its own, stop being known without
// any write.
func TestExpiry(t *testing.T) {
	t.Parallel()
	b, _ := NewMemoryBackend("")
	ta := newTestAPI(t, b, baseConfig(t))
	soon := time.Now().Add(300 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	if st, _, body := ta.do(t, "PUT", "/v1/clients/temp", fmt.Sprintf(`{"api_key_sha256": %q, "expires_at": %q}`, hash("t"), soon)); st != 201 {
		t.Fatalf("PUT: %d %s", st, body)
	}
	if _, ok := ta.cfg.Load().ClientByAPIKey("t"); !ok {
		t.Fatal("the client is not running after its PUT")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := ta.cfg.Load().ClientByAPIKey("t"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client is still known 10 s after it expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := ta.m.Status(); st.Expired != 1 {
		t.Errorf("status %+v; want 1 expired", st)
	}
}

// TestGroups: teams and organisations made through the API charge their clients at their levels
// (the running configuration's limits for the client include the team's and the organisation's,
// under their keys); a bad group is a 400 naming the field; a group with members cannot be
// deleted.
func TestGroups(t *testing.T) {
	t.Parallel()
	b, _ := NewMemoryBackend("")
	ta := newTestAPI(t, b, baseConfig(t))
	for _, c := range []struct{ path, body string }{
		{"/v1/organisations/acme", `{"policy": "standard"}`},
		{"/v1/teams/ml", `{"organisation": "acme", "policy": ["burst"]}`},
		{"/v1/clients/k", fmt.Sprintf(`{"api_key_sha256": %q, "policy": "anon", "team": "ml"}`, hash("k"))},
	} {
		if st, _, body := ta.do(t, "PUT", c.path, c.body); st != 201 {
			t.Fatalf("PUT %s: %d %s", c.path, st, body)
		}
	}
	cfg := ta.cfg.Load()
	cl, ok := cfg.ClientByName("k")
	if !ok {
		t.Fatal("client k is not running")
	}
	var got []string
	for _, a := range cfg.LevelsFor(cl, nil) {
		got = append(got, a.Key+"/"+a.PolicyName)
	}
	if strings.Join(got, " ") != "team:ml/burst org:acme/standard" {
		t.Errorf("k's levels: %v; want the team's burst and the organisation's standard", got)
	}
	for _, c := range []struct{ path, body, field string }{
		{"/v1/teams/t2", `{"organisation": "nope", "policy": "burst"}`, "organisation"},
		{"/v1/teams/t2", `{"policy": "per-path"}`, "policy[0]"},
		{"/v1/teams/t2", `{"policy": []}`, "policy"},
		{"/v1/organisations/o2", `{"organisation": "acme", "policy": "burst"}`, "organisation"},
		{"/v1/clients/k2", fmt.Sprintf(`{"api_key_sha256": %q, "team": "nope"}`, hash("k2")), "team"},
	} {
		st, _, body := ta.do(t, "PUT", c.path, c.body)
		var p struct{ Field string }
		json.Unmarshal([]byte(body), &p)
		if st != 400 || p.Field != c.field {
			t.Errorf("PUT %s %s: %d %s; want 400 naming %s", c.path, c.body, st, body, c.field)
		}
	}
	for _, path := range []string{"/v1/organisations/acme", "/v1/teams/ml"} {
		if st, _, body := ta.do(t, "DELETE", path, ""); st != http.StatusConflict {
			t.Errorf("DELETE %s with members: %d %s; want 409", path, st, body)
		}
	}
	ta.do(t, "DELETE", "/v1/clients/k", "")
	if st, _, body := ta.do(t, "DELETE", "/v1/teams/ml", ""); st != 204 {
		t.Errorf("DELETE the empty team: %d %s", st, body)
	}
}

// TestRegistryFaults, on a real Redis: while Redis answers nothing (frozen), an instance keeps
// running the clients it last read and says why it could not read; once Redis answers, a change
// made meanwhile runs at its next sync (staleness ≤ the outage + one poll + a merge). A Redis
// that comes back empty and is written again past the version the instance had (a flush, a
// failover to a replica that had not got the records) is read whole: the records it lost are
// gone from the instance too, not kept beside the new ones.
func TestRegistryFaults(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}, Prefix: "t:", Timeout: 200 * time.Millisecond, SlowTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := st.Registry()
	base := baseConfig(t)
	ctx := context.Background()
	waitUp := func() {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			if _, _, err := b.Version(ctx); err == nil {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("Redis never answered: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUp()
	writer := newTestAPI(t, b, base)   // another instance: the one written through
	m := NewManager(b, time.Hour, nil) // this instance, synced by hand
	put := func(name string, limit int) {
		t.Helper()
		body := fmt.Sprintf(`{"api_key_sha256": %q, "policy": "standard", "overrides": {"standard": {"limit": %d}}}`, hash(name), limit)
		if st, _, out := writer.do(t, "PUT", "/v1/clients/"+name, body); st/100 != 2 {
			t.Fatalf("PUT %s: %d %s", name, st, out)
		}
	}
	limit := func(name string) int64 {
		t.Helper()
		cfg, err := m.Merge(base)
		if err != nil {
			t.Fatal(err)
		}
		cl, ok := cfg.ClientByName(name)
		if !ok {
			return 0
		}
		return cfg.AppliedPoliciesFor(cl, nil)[0].Policy.Limit
	}
	put("a", 7)
	if _, err := m.Sync(ctx); err != nil || limit("a") != 7 {
		t.Fatalf("after the first sync: %v, a's limit %d; want 7", err, limit("a"))
	}

	rs.Stop() // frozen: answers nothing
	if _, err := m.Sync(ctx); err == nil {
		t.Fatal("a sync against a frozen Redis worked")
	}
	if got, st := limit("a"), m.Status(); got != 7 || st.Error == "" {
		t.Errorf("while Redis is frozen: a's limit %d, status error %q; want 7 (the last read) and why", got, st.Error)
	}
	rs.Cont()
	waitUp()
	put("a", 9)
	if _, err := m.Sync(ctx); err != nil || limit("a") != 9 || m.Status().Error != "" {
		t.Errorf("the first sync after Redis answers: %v, a's limit %d; want 9", err, limit("a"))
	}

	// Redis restarted empty, then written more times than the version the instance had.
	had := m.Status().Version
	rs.Restart()
	waitUp()
	for i := int64(0); i <= had; i++ {
		put("b", 5+int(i))
	}
	if _, err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if limit("a") != 0 || limit("b") != 5+had {
		t.Errorf("after Redis came back empty and was written past version %d: a's limit %d (want 0: gone), b's %d (want %d)", had, limit("a"), limit("b"), 5+had)
	}
}

// BenchmarkMerge is one merge of 10,000 API clients into the file's configuration: the M of the
// propagation bound (docs/design.md).
func BenchmarkMerge(b *testing.B) {
	mb, _ := NewMemoryBackend("")
	ctx := context.Background()
	for i := range 10000 {
		name := fmt.Sprintf("c%d", i)
		data, _ := json.Marshal(Client{Keys: []Key{{SHA256: hash(name)}}, Policy: []string{"standard"}})
		if _, err := mb.Write(ctx, "client/"+name, 0, data, []byte(`{}`)); err != nil {
			b.Fatal(err)
		}
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(baseYAML, hash("file-key"), hash("file-acme-key"))), "sluice.yaml")
	if err != nil {
		b.Fatal(err)
	}
	m := NewManager(mb, 0, nil)
	if _, err := m.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := m.Merge(cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMemoryJournalOneProcess: a second backend on the same journal is refused while the first
// holds it (its appends would interleave with the first's), and gets it once the first is closed;
// a read-only one (sluice check --registry) reads beside it.
func TestMemoryJournalOneProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "clients.journal")
	a, err := NewMemoryBackend(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(context.Background(), "client/x", 0, []byte(`{}`), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMemoryBackend(path); err == nil || !strings.Contains(err.Error(), "held by another process") {
		t.Fatalf("a second backend on a held journal: %v; want refused", err)
	}
	r, err := ReadMemoryBackend(path)
	if err != nil {
		t.Fatalf("read-only beside the holder: %v", err)
	}
	if e, _ := r.Get(context.Background(), "client/x"); e.Rev != 1 {
		t.Errorf("read-only sees %+v", e)
	}
	a.Close()
	b, err := NewMemoryBackend(path)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	b.Close()
}
