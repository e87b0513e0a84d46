package clients

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
)

// API serves the clients API on the admin listener (Mount). Reads need what every admin request
// needs; writes also need Writer to name who writes (a token's name), and are refused without one.
type API struct {
	M *Manager
	// Config returns the configuration running now (the file's, merged): writes are checked
	// against it as the file is by sluice check.
	Config func() *config.Config
	// Base returns the file's configuration (before the merge).
	Base func() *config.Config
	// Writer names who may write with r ("" and a reason: nobody may).
	Writer func(r *http.Request) (who, why string)
	Log    interface {
		Info(msg string, args ...any)
	}
	// Wait bounds how long a write waits for this instance to run it before answering; default 1 s.
	Wait time.Duration
}

// Mount registers the API's routes with handle (an http.ServeMux's Handle).
func (a *API) Mount(handle func(pattern string, h http.Handler)) {
	handle("GET /v1/clients", http.HandlerFunc(a.listClients))
	handle("GET /v1/clients/{name}", a.getter(KindClient))
	handle("PUT /v1/clients/{name}", a.writer(KindClient, a.putClient))
	handle("DELETE /v1/clients/{name}", a.writer(KindClient, nil))
	handle("POST /v1/clients/{name}/keys", http.HandlerFunc(a.newKey))
	handle("GET /v1/plans", http.HandlerFunc(a.listPlans))
	handle("GET /v1/plans/{name}", a.getter(KindPlan))
	handle("PUT /v1/plans/{name}", a.writer(KindPlan, a.putPlan))
	handle("DELETE /v1/plans/{name}", a.writer(KindPlan, nil))
	handle("GET /v1/overrides", http.HandlerFunc(a.listRules))
	handle("GET /v1/overrides/{name}", a.getter(KindOverride))
	handle("PUT /v1/overrides/{name}", a.writer(KindOverride, a.putRule))
	handle("DELETE /v1/overrides/{name}", a.writer(KindOverride, nil))
	for _, kind := range []string{KindTeam, KindOrg} {
		plural := "/v1/" + kind + "s"
		handle("GET "+plural, a.listGroups(kind))
		handle("GET "+plural+"/{name}", a.getter(kind))
		handle("PUT "+plural+"/{name}", a.writer(kind, a.putGroup(kind)))
		handle("DELETE "+plural+"/{name}", a.writer(kind, nil))
	}
	handle("GET /v1/audit", http.HandlerFunc(a.audit))
}

func problem(w http.ResponseWriter, status int, field, format string, args ...any) {
	answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(status), Status: status,
		Detail: fmt.Sprintf(format, args...), Field: field})
}

func badInput(w http.ResponseWriter, err error) {
	var bi *BadInput
	var fe *config.FieldError
	switch {
	case errors.As(err, &bi):
		problem(w, http.StatusBadRequest, bi.Field, "%s; nothing was changed", bi.Error())
	case errors.As(err, &fe):
		problem(w, http.StatusBadRequest, fe.Field, "%s; nothing was changed", fe.Error())
	default:
		problem(w, http.StatusBadRequest, "", "%v; nothing was changed", err)
	}
}

func storeProblem(w http.ResponseWriter, err error) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusServiceUnavailable, "", "the store did not answer (%v); nothing was changed, retry", err)
}

func nameOK(kind, name string) bool {
	if len(name) > MaxNameLen {
		return false
	}
	if kind == KindOverride {
		return patternRE.MatchString(name)
	}
	return nameRE.MatchString(name)
}

func etag(rev int64) string { return `"` + strconv.FormatInt(rev, 10) + `"` }

// view is a record as a GET shows it: the record's fields, and its name, revision and source.
func view(kind, name string, rev int64, data []byte, extra map[string]any) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if kind == KindOverride {
		m["pattern"] = name
	} else {
		m["name"] = name
	}
	m["revision"] = rev
	maps.Copy(m, extra)
	return json.Marshal(m)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func (a *API) getter(kind string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if !nameOK(kind, name) {
			problem(w, http.StatusBadRequest, "name", "%q is not a %s name (1 to %d of A-Z, a-z, 0-9, '.', '_', '-')", name, kind, MaxNameLen)
			return
		}
		e, err := a.M.b.Get(r.Context(), kind+"/"+name)
		if err != nil {
			storeProblem(w, err)
			return
		}
		if e.Data == nil {
			a.notFound(w, kind, name)
			return
		}
		body, err := view(kind, name, e.Rev, e.Data, a.extra(kind, name))
		if err != nil {
			problem(w, http.StatusInternalServerError, "", "the record cannot be read: %v", err)
			return
		}
		w.Header().Set("ETag", etag(e.Rev))
		writeJSON(w, http.StatusOK, body)
	})
}

func (a *API) notFound(w http.ResponseWriter, kind, name string) {
	if kind == KindClient {
		if c, ok := a.Base().ClientByName(name); ok {
			problem(w, http.StatusNotFound, "", "client %q is the configuration file's (line %d), not the API's: PUT it here to manage it at runtime (the API's then runs)", name, c.Line)
			return
		}
	}
	problem(w, http.StatusNotFound, "", "no %s %q", kind, name)
}

// extra is what a GET adds: a client's source and whether it runs; a plan's clients.
func (a *API) extra(kind, name string) map[string]any {
	switch kind {
	case KindClient:
		st := a.M.Status()
		ex := map[string]any{"source": "api", "running": true}
		if why, ok := st.Dropped[name]; ok {
			ex["running"], ex["why"] = false, why
		} else if _, ok := a.Config().ClientByName(name); !ok {
			ex["running"] = false
		}
		if slices.Contains(st.Shadowed, name) {
			ex["shadows_file_client"] = true
		}
		return ex
	case KindPlan:
		return map[string]any{"clients": len(a.M.planClients(name))}
	}
	return nil
}

// preconditions reads If-Match and If-None-Match: the revision a write expects (-1: any; 0:
// none), and whether the caller said so (a mismatch is then 412, not retried).
func preconditions(r *http.Request) (expect int64, given bool, err error) {
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		if strings.TrimSpace(inm) != "*" {
			return 0, false, errors.New("If-None-Match takes only * (create, if it does not exist)")
		}
		return 0, true, nil
	}
	im := strings.TrimSpace(r.Header.Get("If-Match"))
	if im == "" {
		return -1, false, nil
	}
	if im == "*" {
		return -2, true, nil // must exist: checked against the record read
	}
	v, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(im, "W/"), `"`), 10, 64)
	if err != nil || v <= 0 {
		return 0, false, fmt.Errorf("If-Match %q is not an ETag this API gave (a revision in quotes, \"12\")", im)
	}
	return v, true, nil
}

// change is an audit entry's JSON.
type change struct {
	Who    string          `json:"who"`
	Action string          `json:"action"` // put, delete, key
	Kind   string          `json:"kind"`
	Name   string          `json:"name"`
	Before json.RawMessage `json:"before"` // null: created
	After  json.RawMessage `json:"after"`  // null: deleted
}

// redactKeys shortens the key hashes of a client's record to their first 12 hex digits (the
// audit names which key, never enough of its hash to test guesses against).
func redactKeys(kind string, data []byte) json.RawMessage {
	if data == nil {
		return json.RawMessage("null")
	}
	if kind != KindClient {
		return data
	}
	var c Client
	if err := json.Unmarshal(data, &c); err != nil {
		return json.RawMessage("null")
	}
	for i := range c.Keys {
		c.Keys[i].SHA256 = c.Keys[i].SHA256[:12] + "…"
	}
	b, _ := json.Marshal(c)
	return b
}

// prepare checks a new record (data: its JSON; nil for a delete) against the records and the
// configuration; its error is a 400 (or 409 for a delete that would strand clients).
type prepare func(r *http.Request, name string, body, cur []byte, now time.Time, who string) (data []byte, err error)

// writer serves PUT (put) and DELETE (put nil) of kind's records.
func (a *API) writer(kind string, put prepare) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, why := a.Writer(r)
		if who == "" {
			problem(w, http.StatusForbidden, "", "%s", why)
			return
		}
		name := r.PathValue("name")
		if !nameOK(kind, name) {
			problem(w, http.StatusBadRequest, "name", "%q is not a %s name (1 to %d of A-Z, a-z, 0-9, '.', '_', '-'%s)", name, kind, MaxNameLen,
				map[bool]string{true: ", '*'"}[kind == KindOverride])
			return
		}
		if kind == KindClient && name == "anonymous" {
			problem(w, http.StatusBadRequest, "name", "\"anonymous\" names requests of no configured client; choose another name; nothing was changed")
			return
		}
		expect, given, err := preconditions(r)
		if err != nil {
			problem(w, http.StatusBadRequest, "", "%v", err)
			return
		}
		var body []byte
		if put != nil {
			if body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody)); err != nil {
				problem(w, http.StatusRequestEntityTooLarge, "", "the body is over %d bytes, or was cut: %v", MaxBody, err)
				return
			}
		}
		field := kind + "/" + name
		for attempt := 0; ; attempt++ {
			cur, err := a.M.b.Get(r.Context(), field)
			if err != nil {
				storeProblem(w, err)
				return
			}
			if given && (expect == -2 && cur.Data == nil || expect >= 0 && expect != cur.Rev) {
				w.Header().Set("ETag", etag(cur.Rev))
				problem(w, http.StatusPreconditionFailed, "", "%s %q is at revision %d (ETag %s), not the one this write expected: read it again, apply the change, and send it with the new If-Match", kind, name, cur.Rev, etag(cur.Rev))
				return
			}
			var data []byte
			if put != nil {
				if data, err = put(r, name, body, cur.Data, time.Now().UTC(), who); err != nil {
					badInput(w, err)
					return
				}
			} else {
				if cur.Data == nil {
					a.notFound(w, kind, name)
					return
				}
				if err := a.deletable(kind, name); err != nil {
					problem(w, http.StatusConflict, "", "%v; nothing was changed", err)
					return
				}
			}
			action := "put"
			if put == nil {
				action = "delete"
			}
			audit, _ := json.Marshal(change{Who: who, Action: action, Kind: kind, Name: name, Before: redactKeys(kind, cur.Data), After: redactKeys(kind, data)})
			v, err := a.M.b.Write(r.Context(), field, cur.Rev, data, audit)
			switch {
			case errors.Is(err, ErrConflict) && !given && attempt < 8:
				continue // a concurrent write came between the read and this one: again, on it
			case errors.Is(err, ErrConflict):
				problem(w, http.StatusPreconditionFailed, "", "%s %q changed while this write was made (%v): read it again and retry", kind, name, err)
				return
			case err != nil:
				storeProblem(w, err)
				return
			}
			if a.Log != nil {
				a.Log.Info("clients API: "+action, "kind", kind, "name", name, "who", who, "revision", v,
					"before", string(redactKeys(kind, cur.Data)), "after", string(redactKeys(kind, data)))
			}
			a.applied(r.Context(), v)
			if put == nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			out, _ := view(kind, name, v, data, a.extra(kind, name))
			w.Header().Set("ETag", etag(v))
			status := http.StatusOK
			if cur.Data == nil {
				status = http.StatusCreated
			}
			writeJSON(w, status, out)
			return
		}
	})
}

// applied has Run sync at once and waits (up to Wait) until this instance runs version v.
func (a *API) applied(ctx context.Context, v int64) {
	wait := a.Wait
	if wait <= 0 {
		wait = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	select {
	case a.M.kick <- struct{}{}:
	default:
	}
	a.M.waitApplied(ctx, v)
}

// deletable says why a record cannot be deleted: a plan clients still take.
func (a *API) deletable(kind, name string) error {
	switch kind {
	case KindTeam, KindOrg:
		if users := a.M.groupUsers(kind, name); len(users) > 0 {
			return fmt.Errorf("%s %q has %s of the API's: move them first", kind, name, strings.Join(users, ", "))
		}
		return nil
	case KindPlan:
	default:
		return nil
	}
	if cs := a.M.planClients(name); len(cs) > 0 {
		n := len(cs)
		if n > 5 {
			cs = append(cs[:5], "...")
		}
		return fmt.Errorf("plan %q is the plan of %d clients (%s): move them to another plan first", name, n, strings.Join(cs, ", "))
	}
	return nil
}

func (a *API) putClient(r *http.Request, name string, body, cur []byte, now time.Time, who string) ([]byte, error) {
	rec, err := parseClient(body)
	if err != nil {
		return nil, err
	}
	rec.Meta = Meta{Updated: now, UpdatedBy: who}
	var prev Client
	if cur != nil {
		_ = json.Unmarshal(cur, &prev)
	}
	for i := range rec.Keys {
		for _, k := range prev.Keys { // (a key kept keeps when it was made)
			if k.SHA256 == rec.Keys[i].SHA256 && rec.Keys[i].Created == nil {
				rec.Keys[i].Created = k.Created
			}
		}
		if rec.Keys[i].Created == nil {
			rec.Keys[i].Created = &now
		}
	}
	if err := a.checkClient(name, rec, now); err != nil {
		return nil, err
	}
	return json.Marshal(rec)
}

// base is the file's configuration with the API's teams and organisations: what writes are
// checked against.
func (a *API) base() *config.Config {
	a.M.mu.Lock()
	defer a.M.mu.Unlock()
	return a.M.groupsBase(a.Base())
}

// checkClient checks rec as client name against the records and the running configuration.
func (a *API) checkClient(name string, rec *Client, now time.Time) error {
	a.M.mu.Lock()
	var next time.Time
	base := a.M.groupsBase(a.Base())
	cl, err := a.M.resolve(base, name, rec, a.M.sortedRules(), now, &next)
	a.M.mu.Unlock()
	if err != nil {
		if rec.Plan != "" && strings.HasPrefix(err.Error(), "plan ") {
			return bad("plan", "%v (create it with PUT /v1/plans/%s)", err, rec.Plan)
		}
		return bad("keys", "%v", err)
	}
	probe := *cl
	if len(cl.APIKeySHA256) == 0 && cl.JWTSubject == "" {
		// A client may be made before its key (POST .../keys generates one): it runs once it has one.
		probe.APIKeySHA256 = []string{strings.Repeat("0", 64)}
	}
	if err := base.CheckClient(&probe); err != nil {
		return err
	}
	cur := a.Config()
	for i, h := range cl.APIKeySHA256 {
		if o, ok := cur.ClientByKeyHash(h); ok && o.Name != name {
			return bad(fmt.Sprintf("api_key_sha256[%d]", i), "%s… is already a key of client %q; a key names one client", h[:8], o.Name)
		}
	}
	if cl.JWTSubject != "" {
		if o, ok := cur.ClientBySubject(cl.JWTSubject); ok && o.Name != name {
			return bad("jwt_subject", "%q is already client %q's", cl.JWTSubject, o.Name)
		}
	}
	return nil
}

func (a *API) putPlan(r *http.Request, name string, body, cur []byte, now time.Time, who string) ([]byte, error) {
	rec, err := parsePlan(body)
	if err != nil {
		return nil, err
	}
	rec.Meta = Meta{Updated: now, UpdatedBy: who}
	base := a.base()
	probe := &config.Client{Name: "plan-" + name, Policy: rec.Policy, Overrides: overrides(rec.Overrides), JWTSubject: "-"}
	if err := base.CheckClient(probe); err != nil && !strings.HasPrefix(fieldOf(err), "jwt_subject") {
		return nil, err
	}
	// Every client on the plan must still be valid with it.
	a.M.mu.Lock()
	err = trying(a.M.plans, name, rec, func() error { return a.M.checkAll(base, func(c *Client) bool { return c.Plan == name }, now) })
	a.M.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return json.Marshal(rec)
}

func fieldOf(err error) string {
	var fe *config.FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

func (a *API) putRule(r *http.Request, name string, body, cur []byte, now time.Time, who string) ([]byte, error) {
	rec, err := parseRule(body)
	if err != nil {
		return nil, err
	}
	rec.Meta = Meta{Updated: now, UpdatedBy: who}
	base := a.base()
	for _, p := range slices.Sorted(maps.Keys(rec.Overrides)) {
		if _, ok := base.Policy(p); !ok {
			return nil, bad("overrides."+p, "%q is not a policy", p)
		}
	}
	a.M.mu.Lock()
	err = trying(a.M.rules, name, rec, func() error { return a.M.checkAll(base, func(*Client) bool { return true }, now, name) })
	a.M.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return json.Marshal(rec)
}

// checkAll checks the API's clients that which selects (and that match pattern, if given) as
// they would resolve now (under m.mu); the error names the first client that would not run.
func (m *Manager) checkAll(base *config.Config, which func(*Client) bool, now time.Time, pattern ...string) error {
	return m.checkAllWith(m.groupsBase(base), which, now, pattern...)
}

// checkAllWith is checkAll on base as it is (its groups merged already).
func (m *Manager) checkAllWith(base *config.Config, which func(*Client) bool, now time.Time, pattern ...string) error {
	rules := m.sortedRules()
	if len(pattern) > 0 { // a rule applies to the file's clients too
		for _, fc := range base.Clients {
			if !match(pattern[0], fc.Name) {
				continue
			}
			cl := *fc
			cl.Overrides = overrides(applicable(base, fc.Policy, ruleOverrides(rules, fc.Name, nil)))
			if err := base.CheckClient(&cl); err != nil {
				var fe *config.FieldError
				if errors.As(err, &fe) {
					return bad(fe.Field, "client %q (the file's, line %d) would not run with this: %s", fc.Name, fc.Line, fe.Msg)
				}
				return bad("", "client %q (the file's) would not run with this: %v", fc.Name, err)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.clients)) {
		s := m.clients[name]
		if !which(s.Rec) || len(pattern) > 0 && !match(pattern[0], name) || expired(s.Rec.Expires, now) {
			continue
		}
		var next time.Time
		cl, err := m.resolve(base, name, s.Rec, rules, now, &next)
		if err == nil {
			err = base.CheckClient(cl)
		}
		if err != nil {
			var fe *config.FieldError
			if errors.As(err, &fe) {
				return bad(fe.Field, "client %q would not run with this: %s", name, fe.Msg)
			}
			return bad("", "client %q would not run with this: %v", name, err)
		}
	}
	return nil
}

// planClients are the API's clients on plan name.
func (m *Manager) planClients(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, n := range slices.Sorted(maps.Keys(m.clients)) {
		if m.clients[n].Rec.Plan == name {
			out = append(out, n)
		}
	}
	return out
}

// keyBody is POST /v1/clients/{name}/keys's body (optional).
type keyBody struct {
	// Overlap, if set, rotates: the client's other keys expire this long from now.
	Overlap string `json:"overlap"`
	// Expires, if set, is when the new key stops being valid.
	Expires *time.Time `json:"expires_at"`
}

// newKey generates a key for a client, keeps its hash, and shows the key once.
func (a *API) newKey(w http.ResponseWriter, r *http.Request) {
	who, why := a.Writer(r)
	if who == "" {
		problem(w, http.StatusForbidden, "", "%s", why)
		return
	}
	name := r.PathValue("name")
	if !nameOK(KindClient, name) {
		problem(w, http.StatusBadRequest, "name", "%q is not a client name", name)
		return
	}
	var kb keyBody
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		problem(w, http.StatusRequestEntityTooLarge, "", "the body is over %d bytes", MaxBody)
		return
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := decodeStrict(body, &kb); err != nil {
			badInput(w, err)
			return
		}
	}
	var overlap time.Duration
	if kb.Overlap != "" {
		if overlap, err = time.ParseDuration(kb.Overlap); err != nil || overlap < 0 {
			badInput(w, bad("overlap", "%q is not a duration ≥ 0 (e.g. \"24h\")", kb.Overlap))
			return
		}
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		problem(w, http.StatusInternalServerError, "", "no randomness for a key: %v", err)
		return
	}
	key := "sk_" + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(key))
	hash := hex.EncodeToString(sum[:])
	field := KindClient + "/" + name
	for attempt := 0; attempt < 8; attempt++ {
		cur, err := a.M.b.Get(r.Context(), field)
		if err != nil {
			storeProblem(w, err)
			return
		}
		if cur.Data == nil {
			a.notFound(w, KindClient, name)
			return
		}
		var rec Client
		if err := json.Unmarshal(cur.Data, &rec); err != nil {
			problem(w, http.StatusInternalServerError, "", "the record cannot be read: %v", err)
			return
		}
		now := time.Now().UTC()
		var old []string
		if kb.Overlap != "" {
			until := now.Add(overlap)
			for i := range rec.Keys {
				if rec.Keys[i].Expires == nil || rec.Keys[i].Expires.After(until) {
					rec.Keys[i].Expires = &until
					old = append(old, rec.Keys[i].SHA256[:12]+"…")
				}
			}
		}
		rec.Keys = slices.DeleteFunc(rec.Keys, func(k Key) bool { return expired(k.Expires, now) })
		if len(rec.Keys) >= MaxKeys {
			problem(w, http.StatusConflict, "", "client %q has %d keys, the most it may; rotate with an overlap, or PUT it with fewer", name, len(rec.Keys))
			return
		}
		rec.Keys = append(rec.Keys, Key{SHA256: hash, Expires: kb.Expires, Created: &now})
		rec.Meta = Meta{Updated: now, UpdatedBy: who}
		if err := a.checkClient(name, &rec, now); err != nil {
			badInput(w, err)
			return
		}
		data, _ := json.Marshal(rec)
		audit, _ := json.Marshal(change{Who: who, Action: "key", Kind: KindClient, Name: name, Before: redactKeys(KindClient, cur.Data), After: redactKeys(KindClient, data)})
		v, err := a.M.b.Write(r.Context(), field, cur.Rev, data, audit)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			storeProblem(w, err)
			return
		}
		if a.Log != nil {
			a.Log.Info("clients API: key", "kind", KindClient, "name", name, "who", who, "revision", v, "key", hash[:12]+"…", "expiring", strings.Join(old, " "))
		}
		a.applied(r.Context(), v)
		out := map[string]any{"client": name, "api_key": key, "sha256": hash, "revision": v,
			"note": "the key is shown this once; sluice keeps only its SHA-256"}
		if kb.Overlap != "" {
			out["other_keys_expire_at"] = now.Add(overlap)
		}
		b, _ := json.Marshal(out)
		w.Header().Set("ETag", etag(v))
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusCreated, b)
		return
	}
	problem(w, http.StatusConflict, "", "client %q kept changing; retry", name)
}

// page reads ?limit (default 100, at most 1000) and ?after (the last name of the page before).
func page(w http.ResponseWriter, r *http.Request) (limit int, after string, ok bool) {
	limit = 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			problem(w, http.StatusBadRequest, "limit", "limit %q must be 1 to 1000", s)
			return 0, "", false
		}
		limit = n
	}
	return limit, r.URL.Query().Get("after"), true
}

func (a *API) listClients(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix, plan, team, org, policy := q.Get("prefix"), q.Get("plan"), q.Get("team"), q.Get("organisation"), q.Get("policy")
	list(w, r, KindClient, a.M, func(m *Manager) map[string]*stored[Client] { return m.clients }, func(name string, c *Client) bool {
		return strings.HasPrefix(name, prefix) && (plan == "" || c.Plan == plan) && (team == "" || c.Team == team) &&
			(org == "" || c.Organisation == org) && (policy == "" || slices.Contains(c.Policy, policy))
	}, "prefix", "plan", "team", "organisation", "policy")
}

func (a *API) listPlans(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	list(w, r, KindPlan, a.M, func(m *Manager) map[string]*stored[Plan] { return m.plans },
		func(name string, _ *Plan) bool { return strings.HasPrefix(name, prefix) }, "prefix")
}

func (a *API) listRules(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	list(w, r, KindOverride, a.M, func(m *Manager) map[string]*stored[Rule] { return m.rules },
		func(name string, _ *Rule) bool { return strings.HasPrefix(name, prefix) }, "prefix")
}

// list answers a page of kind's records as this instance last read them (at most one poll
// interval old), in name order, those keep selects: {"<kind>s": [...], "next": "<name>",
// "version": V}; ?after=<next> reads the page after.
func list[T any](w http.ResponseWriter, r *http.Request, kind string, m *Manager, records func(*Manager) map[string]*stored[T], keep func(string, *T) bool, filters ...string) {
	limit, after, ok := page(w, r)
	if !ok {
		return
	}
	for k := range r.URL.Query() {
		if k != "limit" && k != "after" && !slices.Contains(filters, k) {
			problem(w, http.StatusBadRequest, k, "%q is not a filter here (want %s; limit, after)", k, strings.Join(filters, ", "))
			return
		}
	}
	m.mu.Lock()
	recs := records(m)
	names := slices.Sorted(maps.Keys(recs))
	items := []json.RawMessage{}
	next, last := "", ""
	for _, n := range names {
		s := recs[n]
		if n <= after || !keep(n, s.Rec) {
			continue
		}
		if len(items) == limit {
			next = last
			break
		}
		data, _ := json.Marshal(s.Rec)
		b, _ := view(kind, n, s.Rev, data, nil)
		items = append(items, b)
		last = n
	}
	v := m.version
	m.mu.Unlock()
	out := map[string]any{kind + "s": items, "version": v}
	if next != "" {
		out["next"] = next
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// audit answers the audit trail, newest first: ?limit (default 100, at most 1000), ?before=V
// (the entries older than version V: the page after one whose last version was V).
func (a *API) audit(w http.ResponseWriter, r *http.Request) {
	limit, _, ok := page(w, r)
	if !ok {
		return
	}
	var before int64
	if s := r.URL.Query().Get("before"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 1 {
			problem(w, http.StatusBadRequest, "before", "before %q must be a version ≥ 1", s)
			return
		}
		before = v
	}
	entries, err := a.M.b.Audit(r.Context(), before, limit)
	if err != nil {
		storeProblem(w, err)
		return
	}
	items := make([]json.RawMessage, 0, len(entries))
	for _, e := range entries {
		var m map[string]any
		if json.Unmarshal(e.Data, &m) != nil {
			continue
		}
		m["version"], m["at"] = e.Version, e.At
		b, _ := json.Marshal(m)
		items = append(items, b)
	}
	out := map[string]any{"audit": items}
	if len(entries) == limit {
		out["next_before"] = entries[len(entries)-1].Version
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// putGroup checks a team's or an organisation's body against the running configuration and the
// API's clients that are in it.
func (a *API) putGroup(kind string) prepare {
	ckind := config.GroupTeam
	if kind == KindOrg {
		ckind = config.GroupOrganisation
	}
	return func(r *http.Request, name string, body, cur []byte, now time.Time, who string) ([]byte, error) {
		rec, err := parseGroup(body, kind)
		if err != nil {
			return nil, err
		}
		rec.Meta = Meta{Updated: now, UpdatedBy: who}
		a.M.mu.Lock()
		defer a.M.mu.Unlock()
		into := a.M.teams
		if kind == KindOrg {
			into = a.M.orgs
		}
		err = trying(into, name, rec, func() error {
			st := Status{Dropped: map[string]string{}}
			base := a.M.mergeGroups(a.Base(), &st)
			if why, ok := st.Dropped[kind+"/"+name]; ok {
				var fe *config.FieldError
				if err := base.CheckGroup(&config.Group{Name: name, Organisation: rec.Organisation, Policy: rec.Policy}, ckind); errors.As(err, &fe) {
					return bad(fe.Field, "%s", fe.Msg)
				}
				return bad("", "%s", why)
			}
			return a.M.checkAllWith(base, func(c *Client) bool { return c.Team == name || c.Organisation == name }, now)
		})
		if err != nil {
			return nil, err
		}
		return json.Marshal(rec)
	}
}

// listGroups lists the API's teams or organisations.
func (a *API) listGroups(kind string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prefix := r.URL.Query().Get("prefix")
		list(w, r, kind, a.M, func(m *Manager) map[string]*stored[Group] {
			if kind == KindOrg {
				return m.orgs
			}
			return m.teams
		}, func(name string, _ *Group) bool { return strings.HasPrefix(name, prefix) }, "prefix")
	})
}

// groupUsers are the API's clients (and, of an organisation, teams) in group name of kind.
func (m *Manager) groupUsers(kind, name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, n := range slices.Sorted(maps.Keys(m.clients)) {
		c := m.clients[n].Rec
		if kind == KindTeam && c.Team == name || kind == KindOrg && c.Organisation == name {
			out = append(out, "client "+n)
		}
	}
	if kind == KindOrg {
		for _, n := range slices.Sorted(maps.Keys(m.teams)) {
			if m.teams[n].Rec.Organisation == name {
				out = append(out, "team "+n)
			}
		}
	}
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("%d more", len(out)-5))
	}
	return out
}

// trying puts rec into records as name (under the Manager's lock), runs check, and puts back
// what was there: a write's record checked among the others before it is written.
func trying[T any](records map[string]*stored[T], name string, rec *T, check func() error) error {
	old, had := records[name]
	records[name] = &stored[T]{Rec: rec}
	defer func() {
		if had {
			records[name] = old
		} else {
			delete(records, name)
		}
	}()
	return check()
}
