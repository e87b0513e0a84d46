package clients

import (
	"context"
	"errors"
	"fmt"

	redisstore "github.com/sluicehq/sluice/store/redis"
)

// RedisBackend is the Backend of a Redis store's registry: the records shared by every instance
// on that Redis (store/redis's Registry has the keys and the script).
func RedisBackend(r *redisstore.Registry) Backend { return registry{r} }

type registry struct{ r *redisstore.Registry }

func (g registry) Version(ctx context.Context) (int64, string, error) { return g.r.Version(ctx) }

func (g registry) Since(ctx context.Context, v int64) ([]Entry, int64, error) {
	es, at, err := g.r.Since(ctx, v)
	out := make([]Entry, len(es))
	for i, e := range es {
		out[i] = Entry{Field: e.Field, Rev: e.Rev, Data: e.Data}
	}
	return out, at, err
}

func (g registry) Get(ctx context.Context, field string) (Entry, error) {
	e, err := g.r.Get(ctx, field)
	return Entry{Field: e.Field, Rev: e.Rev, Data: e.Data}, err
}

func (g registry) Write(ctx context.Context, field string, expect int64, data, audit []byte) (int64, error) {
	v, err := g.r.Write(ctx, field, expect, data, audit)
	switch {
	case errors.Is(err, redisstore.ErrRevision):
		return 0, fmt.Errorf("%w: %v", ErrConflict, err)
	case errors.Is(err, redisstore.ErrNoRecord):
		return 0, ErrNotFound
	}
	return v, err
}

func (g registry) Audit(ctx context.Context, before int64, n int) ([]AuditEntry, error) {
	es, err := g.r.Audit(ctx, before, n)
	out := make([]AuditEntry, len(es))
	for i, e := range es {
		out[i] = AuditEntry{Version: e.Version, At: e.At, Data: e.Data}
	}
	return out, err
}
