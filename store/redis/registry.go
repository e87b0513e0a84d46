package redis

// The clients registry: the records of the clients API (package clients) — clients, plans,
// overrides — kept in Redis so that every instance on it sees them, and their audit trail.
//
// Four keys, in one slot (a hash tag: one script writes them all, on a Redis Cluster too):
//
//	<prefix>{<prefix>registry}:records  hash: "<kind>/<name>" -> "<revision> <JSON>"
//	<prefix>{<prefix>registry}:changes  sorted set: "<kind>/<name>" scored by the version that last wrote it (deletes too)
//	<prefix>{<prefix>registry}:version  hash: v, the last version given (every write takes the next), and
//	                                    epoch, a random name given by the write that began the registry
//	<prefix>{<prefix>registry}:audit    stream: one entry per write, the last AuditKeep kept
//
// (With a prefix that has a hash tag of its own, that tag decides the slot: one slot still.) An
// instance polls the version and epoch (one HMGET); when the version grew, it reads the fields
// whose score is above the version it had, and their records. Another epoch means the registry
// began anew (flushed, a failover to a replica that had not got it), whatever its version now:
// it reads everything again.

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/clients/registry"
)

//go:embed registry.lua
var registryLua string

var registryScript = rueidis.NewLuaScript(registryLua)

// AuditKeep is how many audit entries the registry keeps (about: the stream is trimmed
// approximately, as Redis does best).
const AuditKeep = 10000

// Registry is the clients registry on the store's Redis: a registry.Backend. Its methods are safe
// for concurrent use.
type Registry struct {
	s                                *Store
	records, changes, version, audit string
}

// Registry returns the store's clients registry.
func (s *Store) Registry() *Registry {
	tag := s.prefix + "{" + s.prefix + "registry}:"
	return &Registry{s: s, records: tag + "records", changes: tag + "changes", version: tag + "version", audit: tag + "audit"}
}

func (r *Registry) conn(ctx context.Context) (*conn, context.Context, context.CancelFunc, error) {
	c, err := r.s.connected()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.s.slow)
	return c, ctx, cancel, nil
}

// Version returns the registry's version (0 for none written yet) and its epoch ("" then).
func (r *Registry) Version(ctx context.Context) (int64, string, error) {
	c, ctx, cancel, err := r.conn(ctx)
	if err != nil {
		return 0, "", err
	}
	defer cancel()
	vals, err := c.client.Do(ctx, c.client.B().Hmget().Key(r.version).Field("v", "epoch").Build()).ToArray()
	if err != nil {
		return 0, "", unavailable(err)
	}
	if len(vals) != 2 {
		return 0, "", fmt.Errorf("redis store: registry: HMGET answered %d values", len(vals))
	}
	vs, err := vals[0].ToString()
	if rueidis.IsRedisNil(err) {
		return 0, "", nil
	}
	v, perr := strconv.ParseInt(vs, 10, 64)
	if err != nil || perr != nil {
		return 0, "", fmt.Errorf("redis store: registry: the version is not a number (%q)", vs)
	}
	epoch, _ := vals[1].ToString()
	return v, epoch, nil
}

// Since returns the records written after version v (all of them for 0; deleted ones with nil
// Data), and the version they are current as of: call it again with that.
func (r *Registry) Since(ctx context.Context, v int64) ([]registry.Entry, int64, error) {
	now, _, err := r.Version(ctx)
	if err != nil {
		return nil, 0, err
	}
	c, ctx, cancel, err := r.conn(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer cancel()
	var fields []string
	if v == 0 {
		fields, err = c.client.Do(ctx, c.client.B().Hkeys().Key(r.records).Build()).AsStrSlice()
	} else {
		fields, err = c.client.Do(ctx, c.client.B().Zrangebyscore().Key(r.changes).Min("("+strconv.FormatInt(v, 10)).Max("+inf").Build()).AsStrSlice()
	}
	if err != nil {
		return nil, 0, unavailable(err)
	}
	out := make([]registry.Entry, 0, len(fields))
	for len(fields) > 0 {
		n := min(len(fields), 1000)
		vals, err := c.client.Do(ctx, c.client.B().Hmget().Key(r.records).Field(fields[:n]...).Build()).ToArray()
		if err != nil {
			return nil, 0, unavailable(err)
		}
		for i, val := range vals {
			e := registry.Entry{Field: fields[i]}
			if s, err := val.ToString(); err == nil {
				e.Rev, e.Data, err = parseRecord(s)
				if err != nil {
					return nil, 0, fmt.Errorf("redis store: registry: %s: %w", fields[i], err)
				}
			}
			out = append(out, e)
		}
		fields = fields[n:]
	}
	return out, now, nil
}

func parseRecord(s string) (int64, []byte, error) {
	revS, data, ok := strings.Cut(s, " ")
	rev, err := strconv.ParseInt(revS, 10, 64)
	if !ok || err != nil {
		return 0, nil, fmt.Errorf("not a record (want \"<revision> <JSON>\")")
	}
	return rev, []byte(data), nil
}

// Get returns the record of field (Data nil, Rev 0: none).
func (r *Registry) Get(ctx context.Context, field string) (registry.Entry, error) {
	c, ctx, cancel, err := r.conn(ctx)
	if err != nil {
		return registry.Entry{}, err
	}
	defer cancel()
	s, err := c.client.Do(ctx, c.client.B().Hget().Key(r.records).Field(field).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return registry.Entry{Field: field}, nil
	}
	if err != nil {
		return registry.Entry{}, unavailable(err)
	}
	e := registry.Entry{Field: field}
	e.Rev, e.Data, err = parseRecord(s)
	return e, err
}

// Write writes data as field's record (nil deletes it) if its revision is expect (-1: whatever
// it is; 0: it must not exist), appending audit to the trail in the same step. It returns the
// version the write took (the record's new revision). ErrRevision: the revision was another
// (nothing written); ErrNoRecord: a delete of nothing.
func (r *Registry) Write(ctx context.Context, field string, expect int64, data, audit []byte) (int64, error) {
	c, ctx, cancel, err := r.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer cancel()
	reply, err := registryScript.Exec(ctx, c.client, []string{r.records, r.changes, r.version, r.audit},
		[]string{field, strconv.FormatInt(expect, 10), string(data), string(audit), strconv.Itoa(AuditKeep), newEpoch()}).AsIntSlice()
	if err != nil {
		return 0, unavailable(err)
	}
	if len(reply) != 2 {
		return 0, fmt.Errorf("redis store: registry: the script answered %v", reply)
	}
	switch reply[0] {
	case -1:
		return 0, fmt.Errorf("%w (it is %d)", registry.ErrConflict, reply[1])
	case -2:
		return 0, registry.ErrNotFound
	}
	return reply[0], nil
}

// Audit returns up to n audit entries, the newest first, older than version before (0: the
// newest).
func (r *Registry) Audit(ctx context.Context, before int64, n int) ([]registry.AuditEntry, error) {
	c, ctx, cancel, err := r.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	var out []registry.AuditEntry
	end := "+"
	for len(out) < n {
		entries, err := c.client.Do(ctx, c.client.B().Xrevrange().Key(r.audit).End(end).Start("-").Count(int64(n+1)).Build()).AsXRange()
		if err != nil {
			return nil, unavailable(err)
		}
		for _, e := range entries {
			if e.ID == end {
				continue
			}
			v, _ := strconv.ParseInt(e.FieldValues["v"], 10, 64)
			if before > 0 && v >= before {
				continue
			}
			ms, _, _ := strings.Cut(e.ID, "-")
			msi, _ := strconv.ParseInt(ms, 10, 64)
			out = append(out, registry.AuditEntry{Version: v, At: time.UnixMilli(msi).UTC(), Data: []byte(e.FieldValues["e"])})
			if len(out) == n {
				break
			}
		}
		if len(entries) <= 1 {
			break
		}
		end = entries[len(entries)-1].ID
	}
	return out, nil
}

// newEpoch names a registry that a write begins: random, so that one begun anew is told apart.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var _ registry.Backend = (*Registry)(nil)
