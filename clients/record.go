// Package clients manages clients, plans and overrides at runtime: the clients API on the admin
// listener (api.go), their records in the store's registry (shared by every instance on a Redis;
// a file beside the memory store), and the clients each instance runs, merged with the
// configuration file's (Manager).
//
// Which wins: a client the API has is the one that runs, also when the file names a client so
// too (the file's is then shadowed: sluice check and the operator page list it). Per policy, the
// most specific override wins: the client's own, then override rules by name pattern (an exact
// name before a wildcard, the pattern with more fixed characters first), then its plan's, then
// the policy's own.
package clients

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
)

// Kinds of records (the first part of a registry field, "client/acme").
const (
	KindClient   = "client"
	KindPlan     = "plan"
	KindOverride = "override"
	KindTeam     = "team"
	KindOrg      = "organisation"
)

// Bounds on a record, so that the registry and every instance's memory stay bounded by the
// number of records.
const (
	MaxBody      = 64 << 10 // bytes of a request body
	MaxKeys      = 8        // keys of a client (rotation needs two)
	MaxPolicies  = 16
	MaxOverrides = 32
	MaxMetadata  = 32  // entries
	MaxMetaLen   = 256 // bytes of a metadata key or value
	MaxNameLen   = 128
)

// Key is one of a client's API keys: its SHA-256 (the key itself is never kept), and when it
// stops being valid (rotation), if ever.
type Key struct {
	SHA256  string     `json:"sha256"`
	Expires *time.Time `json:"expires_at,omitempty"`
	Created *time.Time `json:"created_at,omitempty"`
}

// Limits is what an override changes of a policy: its limit, burst or period.
type Limits struct {
	Limit  *int64 `json:"limit,omitempty"`
	Burst  *int64 `json:"burst,omitempty"`
	Period string `json:"period,omitempty"` // a Go duration: "1m", "30s"
}

// Client is a client's record: who it is and its contract.
type Client struct {
	Keys         []Key             `json:"keys,omitempty"`
	JWTSubject   string            `json:"jwt_subject,omitempty"`
	Policy       []string          `json:"policy,omitempty"`
	Plan         string            `json:"plan,omitempty"`
	Team         string            `json:"team,omitempty"`
	Organisation string            `json:"organisation,omitempty"`
	Overrides    map[string]Limits `json:"overrides,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Expires      *time.Time        `json:"expires_at,omitempty"` // after it, the client is unknown (its key anonymous)
	Meta
}

// Plan is a named contract clients can take: its policies and overrides.
type Plan struct {
	Policy    []string          `json:"policy,omitempty"`
	Overrides map[string]Limits `json:"overrides,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Meta
}

// Group is a team's or an organisation's record: the policies its clients' requests are
// charged together, and a team's organisation.
type Group struct {
	Organisation string            `json:"organisation,omitempty"`
	Policy       []string          `json:"policy"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Meta
}

// groupBody is a team's or an organisation's PUT body.
type groupBody struct {
	Organisation string            `json:"organisation"`
	Policy       strings1          `json:"policy"`
	Metadata     map[string]string `json:"metadata"`
	readOnly
}

func parseGroup(body []byte, kind string) (*Group, error) {
	var b groupBody
	if err := decodeStrict(body, &b); err != nil {
		return nil, err
	}
	g := &Group{Organisation: b.Organisation, Policy: b.Policy, Metadata: b.Metadata}
	if kind == KindOrg && g.Organisation != "" {
		return nil, bad("organisation", "an organisation is in no other")
	}
	if g.Organisation != "" && (!nameRE.MatchString(g.Organisation) || len(g.Organisation) > MaxNameLen) {
		return nil, bad("organisation", "%q must be 1 to %d of A-Z, a-z, 0-9, '.', '_' and '-'", g.Organisation, MaxNameLen)
	}
	if len(g.Policy) == 0 {
		return nil, bad("policy", "is required: the policies its clients' requests are charged together")
	}
	if err := checkNames("policy", g.Policy, MaxPolicies); err != nil {
		return nil, err
	}
	return g, checkMetadata(g.Metadata)
}

// Rule is an override by name pattern: the overrides of every client whose name matches it
// ("premium-*"; '*' matches any run of characters, there may be several).
type Rule struct {
	Overrides map[string]Limits `json:"overrides"`
	Meta
}

// Meta is what the registry adds to every record: when and by whom it was last written.
type Meta struct {
	Updated   time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	patternRE = regexp.MustCompile(`^[A-Za-z0-9._*-]+$`)
	hexRE     = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// BadInput is a body's error: the field it is about and what is wrong (a 400 names both).
type BadInput struct {
	Field string
	Msg   string
}

func (e *BadInput) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func bad(field, format string, args ...any) error {
	return &BadInput{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// decodeStrict decodes body into v, refusing unknown fields and trailing data, naming the field
// of a type error.
func decodeStrict(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			return bad(te.Field, "must be %s, not %s", jsonKind(te.Type.String()), te.Value)
		case errors.As(err, &se):
			return bad("", "the body is not JSON: %v (at byte %d)", se, se.Offset)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return bad(f, "is not a field of this record")
		}
		return bad("", "the body is not a JSON object: %v", err)
	}
	if d.More() {
		return bad("", "the body has data after its JSON object")
	}
	return nil
}

func jsonKind(t string) string {
	switch {
	case strings.HasSuffix(t, "strings1"):
		return "a string or a list of strings"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "*int"):
		return "an integer"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "map"):
		return "an object"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	}
	return t
}

// strings1 is a string or a list of strings.
type strings1 []string

func (s *strings1) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &json.UnmarshalTypeError{Value: "something else", Type: reflect.TypeFor[strings1]()}
	}
	*s = many
	return nil
}

// readOnly are the fields a GET adds to a record, accepted in a PUT and ignored, so that a GET's
// body can be PUT back as it is.
type readOnly struct {
	Name      string    `json:"name"`
	Pattern   string    `json:"pattern"`
	Updated   time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
	Revision  int64     `json:"revision"`
	ETag      string    `json:"etag"` // (sluice clients get shows it)
	Source    string    `json:"source"`
	Running   bool      `json:"running"`
	Why       string    `json:"why"`
	Shadows   bool      `json:"shadows_file_client"`
	Clients   int       `json:"clients"`
}

// clientBody is a client's PUT body: the record's fields, with api_key_sha256 (one hash or a
// list) as a short form of keys without an expiry.
type clientBody struct {
	APIKeySHA256 strings1          `json:"api_key_sha256"`
	Keys         []Key             `json:"keys"`
	JWTSubject   string            `json:"jwt_subject"`
	Policy       strings1          `json:"policy"`
	Plan         string            `json:"plan"`
	Team         string            `json:"team"`
	Organisation string            `json:"organisation"`
	Overrides    map[string]Limits `json:"overrides"`
	Metadata     map[string]string `json:"metadata"`
	Expires      *time.Time        `json:"expires_at"`
	readOnly
}

// parseClient reads a client's PUT body into its record, checking what needs no configuration.
func parseClient(body []byte) (*Client, error) {
	var b clientBody
	if err := decodeStrict(body, &b); err != nil {
		return nil, err
	}
	c := &Client{Keys: b.Keys, JWTSubject: b.JWTSubject, Policy: b.Policy, Plan: b.Plan, Team: b.Team,
		Organisation: b.Organisation, Overrides: b.Overrides, Metadata: b.Metadata, Expires: b.Expires}
	for i := range c.Keys {
		if !hexRE.MatchString(c.Keys[i].SHA256) {
			return nil, bad(fmt.Sprintf("keys[%d].sha256", i), "must be 64 hex digits (the SHA-256 of the key: printf %%s KEY | sha256sum)")
		}
		c.Keys[i].SHA256 = strings.ToLower(c.Keys[i].SHA256)
	}
	for i, h := range b.APIKeySHA256 {
		if !hexRE.MatchString(h) {
			return nil, bad(fmt.Sprintf("api_key_sha256[%d]", i), "must be 64 hex digits (the SHA-256 of the key: printf %%s KEY | sha256sum), not %d characters", len(h))
		}
		h = strings.ToLower(h)
		if slices.Contains(b.APIKeySHA256[:i], b.APIKeySHA256[i]) {
			return nil, bad(fmt.Sprintf("api_key_sha256[%d]", i), "is listed twice")
		}
		if !slices.ContainsFunc(c.Keys, func(k Key) bool { return k.SHA256 == h }) {
			c.Keys = append(c.Keys, Key{SHA256: h})
		}
	}
	if len(c.Keys) > MaxKeys {
		return nil, bad("api_key_sha256", "%d keys; at most %d (two overlap while one is rotated)", len(c.Keys), MaxKeys)
	}
	for i, k := range c.Keys {
		for _, o := range c.Keys[:i] {
			if o.SHA256 == k.SHA256 {
				return nil, bad(fmt.Sprintf("keys[%d].sha256", i), "is listed twice")
			}
		}
	}
	if err := checkNames("policy", c.Policy, MaxPolicies); err != nil {
		return nil, err
	}
	for f, v := range map[string]string{"plan": c.Plan, "team": c.Team, "organisation": c.Organisation} {
		if v != "" && (!nameRE.MatchString(v) || len(v) > MaxNameLen) {
			return nil, bad(f, "%q must be 1 to %d of A-Z, a-z, 0-9, '.', '_' and '-'", v, MaxNameLen)
		}
	}
	if len(c.JWTSubject) > 1024 {
		return nil, bad("jwt_subject", "is %d bytes; at most 1024", len(c.JWTSubject))
	}
	if err := checkOverrides(c.Overrides); err != nil {
		return nil, err
	}
	if err := checkMetadata(c.Metadata); err != nil {
		return nil, err
	}
	return c, nil
}

// planBody is a plan's PUT body.
type planBody struct {
	Policy    strings1          `json:"policy"`
	Overrides map[string]Limits `json:"overrides"`
	Metadata  map[string]string `json:"metadata"`
	readOnly
}

func parsePlan(body []byte) (*Plan, error) {
	var b planBody
	if err := decodeStrict(body, &b); err != nil {
		return nil, err
	}
	p := &Plan{Policy: b.Policy, Overrides: b.Overrides, Metadata: b.Metadata}
	if len(p.Policy) == 0 {
		return nil, bad("policy", "a plan names at least one policy")
	}
	if err := checkNames("policy", p.Policy, MaxPolicies); err != nil {
		return nil, err
	}
	if err := checkOverrides(p.Overrides); err != nil {
		return nil, err
	}
	return p, checkMetadata(p.Metadata)
}

// ruleBody is an override rule's PUT body.
type ruleBody struct {
	Overrides map[string]Limits `json:"overrides"`
	readOnly
}

func parseRule(body []byte) (*Rule, error) {
	var b ruleBody
	if err := decodeStrict(body, &b); err != nil {
		return nil, err
	}
	if len(b.Overrides) == 0 {
		return nil, bad("overrides", "an override rule overrides at least one policy: {\"overrides\": {\"<policy>\": {\"limit\": N}}}")
	}
	return &Rule{Overrides: b.Overrides}, checkOverrides(b.Overrides)
}

func checkNames(field string, names []string, most int) error {
	if len(names) > most {
		return bad(field, "%d names; at most %d", len(names), most)
	}
	for i, n := range names {
		if !nameRE.MatchString(n) {
			return bad(fmt.Sprintf("%s[%d]", field, i), "%q is not a policy name", n)
		}
		if slices.Contains(names[:i], n) {
			return bad(fmt.Sprintf("%s[%d]", field, i), "%q is listed twice", n)
		}
	}
	return nil
}

func checkOverrides(o map[string]Limits) error {
	if len(o) > MaxOverrides {
		return bad("overrides", "%d policies; at most %d", len(o), MaxOverrides)
	}
	for _, name := range slices.Sorted(maps.Keys(o)) {
		l := o[name]
		f := "overrides." + name
		if !nameRE.MatchString(name) {
			return bad(f, "%q is not a policy name", name)
		}
		if l.Limit == nil && l.Burst == nil && l.Period == "" {
			return bad(f, "changes nothing: give limit, burst or period")
		}
		if l.Limit != nil && *l.Limit <= 0 {
			return bad(f+".limit", "%d must be > 0", *l.Limit)
		}
		if l.Burst != nil && *l.Burst < 0 {
			return bad(f+".burst", "%d must be ≥ 0", *l.Burst)
		}
		if l.Period != "" {
			d, err := time.ParseDuration(l.Period)
			if err != nil || d <= 0 {
				return bad(f+".period", "%q is not a duration > 0 (e.g. \"1m\", \"30s\")", l.Period)
			}
		}
	}
	return nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > MaxMetadata {
		return bad("metadata", "%d entries; at most %d", len(m), MaxMetadata)
	}
	for k, v := range m {
		if len(k) == 0 || len(k) > MaxMetaLen || len(v) > MaxMetaLen {
			return bad("metadata."+k, "keys are 1 to %d bytes, values at most %d", MaxMetaLen, MaxMetaLen)
		}
	}
	return nil
}

// overrides converts o to the configuration's form (checked: the periods parse).
func overrides(o map[string]Limits) map[string]config.Override {
	if len(o) == 0 {
		return nil
	}
	out := make(map[string]config.Override, len(o))
	for name, l := range o {
		co := config.Override{Limit: l.Limit, Burst: l.Burst}
		if l.Period != "" {
			d, _ := time.ParseDuration(l.Period)
			co.Period = &d
		}
		out[name] = co
	}
	return out
}

// match reports whether name matches pattern, '*' matching any run of characters.
func match(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	name = name[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(name, p)
		if i < 0 {
			return false
		}
		name = name[i+len(p):]
	}
	return strings.HasSuffix(name, last) && len(name) >= len(last)
}

// specificity orders patterns: an exact name first, then more fixed characters, then by the
// pattern itself.
func specificity(a, b string) int {
	ea, eb := !strings.Contains(a, "*"), !strings.Contains(b, "*")
	switch {
	case ea && !eb:
		return -1
	case eb && !ea:
		return 1
	}
	fa, fb := len(strings.ReplaceAll(a, "*", "")), len(strings.ReplaceAll(b, "*", ""))
	if fa != fb {
		return fb - fa
	}
	return strings.Compare(a, b)
}
