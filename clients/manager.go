package clients

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/config"
)

// DefaultPoll is how often a Manager asks its backend for the registry's version.
const DefaultPoll = 100 * time.Millisecond

// Manager holds the registry's records as this instance last read them, keeps them current
// (Run), merges them into a configuration (Merge) and writes through the API (api.go).
type Manager struct {
	b    Backend
	log  *slog.Logger
	poll time.Duration

	mu      sync.Mutex
	version int64  // the registry's version the records are current as of
	epoch   string // and its epoch
	clients map[string]*stored[Client]
	plans   map[string]*stored[Plan]
	rules   map[string]*stored[Rule]
	teams   map[string]*stored[Group]
	orgs    map[string]*stored[Group]
	synced  time.Time // when the last sync reached the backend
	syncErr string    // why the last sync failed; "" if it worked

	// apply is called (on Run's goroutine, or a writer's) when the records changed: the Server
	// merges them into a new running configuration. It returns the version it merged.
	apply   func()
	applied chan struct{} // closed and replaced at each applied change
	kick    chan struct{} // a write asks Run to sync now
	status  Status        // of the last merge
	now     func() time.Time
}

// stored is a record with its revision.
type stored[T any] struct {
	Rev int64
	Rec *T
}

// Status is what the last merge made of the records (the operator page, /v1/stats, sluice check).
type Status struct {
	Version  int64     `json:"version"`
	SyncedAt time.Time `json:"synced_at,omitzero"`
	Error    string    `json:"error,omitempty"` // why the last sync with the store failed
	FromAPI  int       `json:"from_api"`        // clients running from the API
	FromFile int       `json:"from_file"`       // clients running from the file
	// Shadowed are the file's clients the API has a client of the same name for: the API's runs.
	Shadowed []string `json:"shadowed,omitempty"`
	// ShadowedGroups are the file's teams and organisations ("team/ml") the API's replace.
	ShadowedGroups []string `json:"shadowed_groups,omitempty"`
	// Dropped are the API's clients that cannot run under the configuration now (a policy it
	// names is gone, a key another client has), with why: their keys are anonymous until mended.
	Dropped map[string]string `json:"dropped,omitempty"`
	Expired int               `json:"expired"` // API clients past their expires_at

	expiry time.Time // the earliest expiry ahead (a client's or a key's): the next merge is due then
}

// NewManager returns a Manager of b's records; poll 0 is DefaultPoll. Call SetApply, then Sync
// once (the records at the start) and Run.
func NewManager(b Backend, poll time.Duration, log *slog.Logger) *Manager {
	if poll <= 0 {
		poll = DefaultPoll
	}
	return &Manager{b: b, log: log, poll: poll, clients: map[string]*stored[Client]{}, plans: map[string]*stored[Plan]{},
		rules: map[string]*stored[Rule]{}, teams: map[string]*stored[Group]{}, orgs: map[string]*stored[Group]{}, applied: make(chan struct{}), kick: make(chan struct{}, 1), now: time.Now}
}

// SetApply has the Manager call apply whenever the records change (and at an expiry).
func (m *Manager) SetApply(apply func()) { m.apply = apply }

// Sync reads what changed in the registry since the last sync and reports whether anything did.
func (m *Manager) Sync(ctx context.Context) (bool, error) {
	v, epoch, err := m.b.Version(ctx)
	if err != nil {
		m.failed(err)
		return false, err
	}
	m.mu.Lock()
	have, had := m.version, m.epoch
	m.mu.Unlock()
	if v == have && epoch == had {
		m.mu.Lock()
		m.synced, m.syncErr = m.now(), ""
		m.mu.Unlock()
		return false, nil
	}
	since := have
	if v < have || epoch != had { // the registry began anew (flushed, failed over): read it whole
		since = 0
	}
	entries, at, err := m.b.Since(ctx, since)
	if err != nil {
		m.failed(err)
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if since == 0 {
		m.clients, m.plans, m.rules = map[string]*stored[Client]{}, map[string]*stored[Plan]{}, map[string]*stored[Rule]{}
		m.teams, m.orgs = map[string]*stored[Group]{}, map[string]*stored[Group]{}
	}
	for _, e := range entries {
		if err := m.take(e); err != nil && m.log != nil {
			m.log.Error("clients registry: a record cannot be read; it is left out", "field", e.Field, "error", err.Error())
		}
	}
	m.version, m.epoch, m.synced, m.syncErr = at, epoch, m.now(), ""
	return true, nil
}

func (m *Manager) failed(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.syncErr == "" && m.log != nil {
		m.log.Warn("clients registry: cannot read the store; the clients last read keep running", "error", err.Error())
	}
	m.syncErr = err.Error()
}

// take applies one entry (under m.mu).
func (m *Manager) take(e Entry) error {
	kind, name, ok := strings.Cut(e.Field, "/")
	if !ok {
		return fmt.Errorf("field %q is not kind/name", e.Field)
	}
	switch kind {
	case KindClient:
		return takeInto(m.clients, name, e)
	case KindPlan:
		return takeInto(m.plans, name, e)
	case KindOverride:
		return takeInto(m.rules, name, e)
	case KindTeam:
		return takeInto(m.teams, name, e)
	case KindOrg:
		return takeInto(m.orgs, name, e)
	}
	return fmt.Errorf("unknown kind %q", kind)
}

func takeInto[T any](into map[string]*stored[T], name string, e Entry) error {
	if e.Data == nil {
		delete(into, name)
		return nil
	}
	var rec T
	if err := json.Unmarshal(e.Data, &rec); err != nil {
		return err
	}
	into[name] = &stored[T]{Rev: e.Rev, Rec: &rec}
	return nil
}

// Run keeps the records current until ctx ends: it asks for the version every poll interval,
// and calls apply when they changed or a key or client expired.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
		changed, _ := m.Sync(ctx)
		m.mu.Lock()
		expiry := !m.status.expiry.IsZero() && !m.now().Before(m.status.expiry)
		m.mu.Unlock()
		if changed || expiry {
			m.Apply()
		}
	}
}

// Apply calls apply (the Server's merge) and wakes those waiting for a version (WaitApplied).
func (m *Manager) Apply() {
	if m.apply != nil {
		m.apply()
	}
	m.mu.Lock()
	close(m.applied)
	m.applied = make(chan struct{})
	m.mu.Unlock()
}

// Merge returns base with the registry's clients merged in (see the package's doc for which
// wins), and records what it made of them (Status).
func (m *Manager) Merge(base *config.Config) (*config.Config, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	st := Status{Version: m.version, SyncedAt: m.synced, Error: m.syncErr, Dropped: map[string]string{}}
	base = m.mergeGroups(base, &st)
	rules := m.sortedRules()
	// The API's clients that can run under base: each replaces the file's client of its name.
	var candidates []*config.Client
	replaces := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(m.clients)) {
		s := m.clients[name]
		if expired(s.Rec.Expires, now) {
			st.Expired++
			continue
		}
		if s.Rec.Expires != nil {
			st.expiry = earliest(st.expiry, *s.Rec.Expires)
		}
		cl, err := m.resolve(base, name, s.Rec, rules, now, &st.expiry)
		if err == nil && len(cl.APIKeySHA256) == 0 && cl.JWTSubject == "" {
			err = noKey(name, len(s.Rec.Keys) > 0)
		}
		if err == nil {
			err = base.CheckClient(cl)
		}
		if err != nil {
			st.Dropped[name] = err.Error()
			continue
		}
		candidates = append(candidates, cl)
		replaces[name] = true
	}
	var out []*config.Client
	file := map[string]*config.Client{}
	for _, fc := range base.Clients {
		cl := *fc
		if t, ok := base.TeamByName(fc.Team); ok && slices.Contains(st.ShadowedGroups, KindTeam+"/"+fc.Team) {
			cl.Organisation = t.Organisation // (its team is the API's now: so is its organisation)
		}
		if o := applicable(base, fc.Policy, ruleOverrides(rules, fc.Name, nil)); len(o) > 0 {
			if cl.Overrides = overrides(o); base.CheckClient(&cl) != nil {
				cl.Overrides = nil // (a rule that does not fit a file client leaves it as the file says: checkAll refuses such a rule)
			}
		}
		file[fc.Name] = &cl
		if !replaces[fc.Name] {
			out = append(out, &cl)
		}
	}
	taken := map[string]string{} // key hash or subject -> client, to drop a later duplicate
	take := func(cl *config.Client) bool {
		for _, id := range identities(cl) {
			if other, ok := taken[id]; ok && other != cl.Name {
				st.Dropped[cl.Name] = fmt.Sprintf("its key or subject is client %q's too", other)
				return false
			}
		}
		for _, id := range identities(cl) {
			taken[id] = cl.Name
		}
		return true
	}
	for _, fc := range out {
		take(fc)
	}
	for _, cl := range candidates {
		if !take(cl) {
			if fc, ok := file[cl.Name]; ok && take(fc) { // (it cannot run: the file's does)
				out = append(out, fc)
			}
			continue
		}
		if _, ok := file[cl.Name]; ok {
			st.Shadowed = append(st.Shadowed, cl.Name)
		}
		out = append(out, cl)
		st.FromAPI++
	}
	st.FromFile = len(out) - st.FromAPI
	if len(st.Dropped) == 0 {
		st.Dropped = nil
	}
	cfg, err := base.WithClients(out)
	if err != nil {
		return nil, err
	}
	for name, why := range st.Dropped {
		if prev, ok := m.status.Dropped[name]; !ok || prev != why {
			if m.log != nil {
				m.log.Warn("clients registry: a client cannot run under this configuration; its keys are anonymous until it is mended", "client", name, "why", why)
			}
		}
	}
	m.status = st
	return cfg, nil
}

// noKey is why a client with no key (expired: its keys all did) and no jwt_subject cannot run.
func noKey(name string, expired bool) error {
	if expired {
		return fmt.Errorf("every key it has expired: POST /v1/clients/%s/keys makes one", name)
	}
	return fmt.Errorf("it has no key yet: POST /v1/clients/%s/keys makes one", name)
}

// mergeGroups is base with the API's teams and organisations beside the file's (the API's
// replacing the file's of one name); those that cannot be (a policy gone, an organisation not
// there) are dropped with why.
func (m *Manager) mergeGroups(base *config.Config, st *Status) *config.Config {
	if len(m.teams) == 0 && len(m.orgs) == 0 {
		return base
	}
	orgs := m.groupsOf(base, base.Organisations, m.orgs, KindOrg, config.GroupOrganisation, st)
	withOrgs := base.WithGroups(base.Teams, orgs)
	teams := m.groupsOf(withOrgs, base.Teams, m.teams, KindTeam, config.GroupTeam, st)
	return base.WithGroups(teams, orgs)
}

// groupsBase is base with the API's teams and organisations (under m.mu): what the API's clients
// are checked against.
func (m *Manager) groupsBase(base *config.Config) *config.Config {
	return m.mergeGroups(base, &Status{Dropped: map[string]string{}})
}

// groupsOf merges the file's groups and the API's of one kind, checked against base.
func (m *Manager) groupsOf(base *config.Config, file []*config.Group, api map[string]*stored[Group], kind, ckind string, st *Status) []*config.Group {
	var out []*config.Group
	replaces := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(api)) {
		rec := api[name].Rec
		g := &config.Group{Name: name, Organisation: rec.Organisation, Policy: rec.Policy}
		if err := base.CheckGroup(g, ckind); err != nil {
			st.Dropped[kind+"/"+name] = err.Error() // (the file's of its name, if any, stays)
			continue
		}
		out = append(out, g)
		replaces[name] = true
	}
	for _, g := range file {
		if replaces[g.Name] {
			st.ShadowedGroups = append(st.ShadowedGroups, kind+"/"+g.Name)
			continue
		}
		out = append(out, g)
	}
	return out
}

func identities(cl *config.Client) []string {
	ids := slices.Clone(cl.APIKeySHA256)
	if cl.JWTSubject != "" {
		ids = append(ids, "sub:"+cl.JWTSubject)
	}
	return ids
}

func expired(t *time.Time, now time.Time) bool { return t != nil && !now.Before(*t) }

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// resolve makes the configuration's client of record rec: its live keys, its policies (its own,
// else its plan's), and its overrides by precedence (its own, the rules, its plan's). next is
// lowered to the earliest key expiry ahead.
func (m *Manager) resolve(base *config.Config, name string, rec *Client, rules []namedRule, now time.Time, next *time.Time) (*config.Client, error) {
	cl := &config.Client{Name: name, JWTSubject: rec.JWTSubject, Policy: rec.Policy, Plan: rec.Plan, Source: config.SourceAPI,
		Team: rec.Team, Organisation: rec.Organisation}
	for _, k := range rec.Keys {
		if expired(k.Expires, now) {
			continue
		}
		if k.Expires != nil {
			*next = earliest(*next, *k.Expires)
		}
		cl.APIKeySHA256 = append(cl.APIKeySHA256, k.SHA256)
	}
	var planOver map[string]Limits
	if rec.Plan != "" {
		p, ok := m.plans[rec.Plan]
		if !ok {
			return nil, fmt.Errorf("plan %q does not exist", rec.Plan)
		}
		if len(cl.Policy) == 0 {
			cl.Policy = p.Rec.Policy
		}
		planOver = p.Rec.Overrides
	}
	merged := applicable(base, cl.Policy, planOver)
	maps.Copy(merged, applicable(base, cl.Policy, ruleOverrides(rules, name, nil)))
	maps.Copy(merged, rec.Overrides) // (its own: all checked, an error if one does not apply)
	cl.Overrides = overrides(merged)
	return cl, nil
}

// applicable is the overrides of o (a plan's or the rules') of the policies a client of policies
// (empty: the default) has: the others are not that client's.
func applicable(base *config.Config, policies []string, o map[string]Limits) map[string]Limits {
	if len(policies) == 0 {
		policies = base.DefaultPolicy
	}
	out := map[string]Limits{}
	for p, l := range o {
		if slices.Contains(policies, p) {
			out[p] = l
		}
	}
	return out
}

type namedRule struct {
	pattern string
	rule    *Rule
}

// sortedRules are the rules, the most specific first.
func (m *Manager) sortedRules() []namedRule {
	out := make([]namedRule, 0, len(m.rules))
	for p, s := range m.rules {
		out = append(out, namedRule{p, s.Rec})
	}
	slices.SortFunc(out, func(a, b namedRule) int { return specificity(a.pattern, b.pattern) })
	return out
}

// ruleOverrides is what the rules matching name override, per policy the most specific rule's
// (into, if not nil).
func ruleOverrides(rules []namedRule, name string, into map[string]Limits) map[string]Limits {
	for _, r := range rules {
		if !match(r.pattern, name) {
			continue
		}
		for p, l := range r.rule.Overrides {
			if _, ok := into[p]; ok {
				continue
			}
			if into == nil {
				into = map[string]Limits{}
			}
			into[p] = l
		}
	}
	return into
}

// Status returns what the last merge made of the records.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Shadowed = slices.Clone(st.Shadowed)
	st.Dropped = maps.Clone(st.Dropped)
	st.Error = m.syncErr
	st.SyncedAt = m.synced
	return st
}

// waitApplied waits until a merge has applied version v (or ctx ends).
func (m *Manager) waitApplied(ctx context.Context, v int64) {
	for {
		m.mu.Lock()
		done, ch := m.status.Version >= v, m.applied
		m.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}
