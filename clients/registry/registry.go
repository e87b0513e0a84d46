// Package registry names what a store keeps of the clients API's records (package clients): the
// Backend a store implements (the Redis store's Registry; clients.MemoryBackend), its entries and
// its errors. It imports nothing of ours, so that a store can implement it without importing the
// clients API, and the clients API can use a store's without importing a store.
package registry

import (
	"context"
	"errors"
	"time"
)

// Backend keeps the registry's records: the store's Redis (shared by every instance on it), or a
// process's memory. Its methods are safe for concurrent use.
type Backend interface {
	// Version is the registry's version, which grows with every write (0 before any), and its
	// epoch: another epoch is a registry begun anew (flushed), to be read whole.
	Version(ctx context.Context) (int64, string, error)
	// Since returns the records written after version v (all of them for 0), Data nil for those
	// deleted, and the version they are current as of.
	Since(ctx context.Context, v int64) ([]Entry, int64, error)
	// Get returns field's record (Rev 0, Data nil: none).
	Get(ctx context.Context, field string) (Entry, error)
	// Write writes data (nil: deletes) as field's record if its revision is expect (-1: any; 0:
	// it must not exist), with audit in the trail in the same step, and returns the version the
	// write took. ErrConflict: the revision was another; ErrNotFound: a delete of nothing.
	Write(ctx context.Context, field string, expect int64, data, audit []byte) (int64, error)
	// Audit returns up to n audit entries older than version before (0: the newest), newest first.
	Audit(ctx context.Context, before int64, n int) ([]AuditEntry, error)
}

// Entry is one record of the registry: its field ("client/acme"), revision (the version that
// wrote it) and JSON.
type Entry struct {
	Field string
	Rev   int64
	Data  []byte
}

// AuditEntry is one entry of the audit trail as kept: its version, when, and its JSON.
type AuditEntry struct {
	Version int64
	At      time.Time
	Data    []byte
}

// Errors of Backend.Write.
var (
	ErrConflict = errors.New("the record's revision is not the one expected")
	ErrNotFound = errors.New("no such record")
)
