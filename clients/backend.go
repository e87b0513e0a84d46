package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/clients/registry"
)

// Backend keeps the registry's records (registry.Backend): the Redis store's Registry, or
// MemoryBackend.
type Backend = registry.Backend

// Entry is one record of the registry (registry.Entry).
type Entry = registry.Entry

// AuditEntry is one entry of the audit trail as kept (registry.AuditEntry).
type AuditEntry = registry.AuditEntry

// Errors of Backend.Write.
var (
	ErrConflict = registry.ErrConflict
	ErrNotFound = registry.ErrNotFound
)

// MemoryAuditKeep is how many audit entries MemoryBackend keeps.
const MemoryAuditKeep = 10000

// MemoryBackend keeps the registry in this process, and, if it has a file, in that file too: a
// journal, one JSON line per write appended and synced before the write is answered, which
// NewMemoryBackend replays (a last line cut short by a crash is dropped: that write was never
// answered) and rewrites compacted when it holds more than twice the lines it needs. So the
// records survive a restart. Without a file they live as long as the process.
type MemoryBackend struct {
	mu       sync.Mutex
	path     string
	file     *os.File // the journal, open for appending; nil without a path
	lines    int      // in the journal
	version  int64
	records  map[string]Entry
	changed  map[string]int64 // field -> the version that last wrote it (deletes too)
	audit    []AuditEntry     // oldest first, at most MemoryAuditKeep
	readOnly bool
	lock     *os.File // path + ".lock", held while the journal is open (not read-only)
}

// journalLine is one write in MemoryBackend's journal.
type journalLine struct {
	Version int64           `json:"v"`
	Field   string          `json:"f"`
	Data    json.RawMessage `json:"d,omitempty"` // absent: deleted
	At      time.Time       `json:"t"`
	Audit   json.RawMessage `json:"a,omitempty"`
}

// NewMemoryBackend returns a MemoryBackend, replaying path's journal (if path is not "") when
// it exists. Close it to close the journal. One process at a time may have a journal open so.
func NewMemoryBackend(path string) (*MemoryBackend, error) {
	return openMemoryBackend(path, false)
}

// ReadMemoryBackend returns path's records as NewMemoryBackend would, without writing to the
// file ever (sluice check reads the journal of a running instance): its Write fails.
func ReadMemoryBackend(path string) (*MemoryBackend, error) {
	return openMemoryBackend(path, true)
}

func openMemoryBackend(path string, readOnly bool) (_ *MemoryBackend, err error) {
	m := &MemoryBackend{path: path, records: map[string]Entry{}, changed: map[string]int64{}}
	if path == "" {
		return m, nil
	}
	if !readOnly {
		lock, err := lockFile(path + ".lock")
		if err != nil {
			return nil, fmt.Errorf("clients file: %w", err)
		}
		m.lock = lock
		defer func() {
			if err != nil {
				unlockFile(lock)
			}
		}()
	}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("clients file: %w", err)
	}
	lines := bytes.Split(b, []byte("\n"))
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var j journalLine
		if err := json.Unmarshal(line, &j); err != nil || j.Version <= m.version || j.Field == "" {
			if i == len(lines)-1 {
				break // a write cut short: never answered
			}
			return nil, fmt.Errorf("clients file %s: line %d is not a journal line of this version's (want {\"v\":N,\"f\":...} with N growing)", path, i+1)
		}
		m.apply(j)
	}
	switch {
	case readOnly:
		m.readOnly = true
		return m, nil
	case m.lines > 2*len(m.records)+1000 || len(lines) > 0 && len(bytes.TrimSpace(lines[len(lines)-1])) > 0:
		err = m.compact()
	default:
		m.file, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("clients file: %w", err)
	}
	return m, nil
}

// apply takes one write into memory.
func (m *MemoryBackend) apply(j journalLine) {
	if j.Data == nil {
		delete(m.records, j.Field)
	} else {
		m.records[j.Field] = Entry{Field: j.Field, Rev: j.Version, Data: []byte(j.Data)}
	}
	m.changed[j.Field] = j.Version
	if j.Audit != nil {
		m.audit = append(m.audit, AuditEntry{Version: j.Version, At: j.At, Data: []byte(j.Audit)})
		if len(m.audit) > MemoryAuditKeep {
			m.audit = append(m.audit[:0:0], m.audit[len(m.audit)-MemoryAuditKeep:]...)
		}
	}
	m.version = j.Version
	m.lines++
}

// compact rewrites the journal with one line per record and per audit entry kept (to a
// temporary file beside it, synced, renamed over it), and opens it for appending.
func (m *MemoryBackend) compact() error {
	var buf bytes.Buffer
	audit := map[int64]AuditEntry{}
	for _, a := range m.audit {
		audit[a.Version] = a
	}
	var js []journalLine
	for field, v := range m.changed {
		j := journalLine{Version: v, Field: field}
		if e, ok := m.records[field]; ok {
			j.Data = e.Data
		}
		if a, ok := audit[v]; ok {
			j.At, j.Audit = a.At, a.Data
			delete(audit, v)
		}
		js = append(js, j)
	}
	for _, a := range audit { // entries of versions a later write of the same field replaced
		js = append(js, journalLine{Version: a.Version, Field: "-", At: a.At, Audit: a.Data})
	}
	sort.Slice(js, func(i, k int) bool { return js[i].Version < js[k].Version })
	for _, j := range js {
		b, _ := json.Marshal(j)
		buf.Write(b)
		buf.WriteByte('\n')
	}
	tmp, err := os.CreateTemp(filepath.Dir(m.path), filepath.Base(m.path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), m.path); err != nil {
		return err
	}
	if m.file != nil {
		m.file.Close()
	}
	m.lines = len(js)
	m.file, err = os.OpenFile(m.path, os.O_WRONLY|os.O_APPEND, 0o600)
	return err
}

// Close closes the journal.
func (m *MemoryBackend) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.file == nil {
		return nil
	}
	err := m.file.Close()
	m.file = nil
	if m.lock != nil {
		unlockFile(m.lock)
	}
	return err
}

func (m *MemoryBackend) Version(context.Context) (int64, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, "", nil
}

func (m *MemoryBackend) Since(_ context.Context, v int64) ([]Entry, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Entry
	for field, at := range m.changed {
		if at <= v || field == "-" {
			continue
		}
		e, ok := m.records[field]
		if !ok {
			if v == 0 {
				continue // (all there is: nothing deleted to tell of)
			}
			e = Entry{Field: field}
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out, m.version, nil
}

func (m *MemoryBackend) Get(_ context.Context, field string) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.records[field]; ok {
		return e, nil
	}
	return Entry{Field: field}, nil
}

func (m *MemoryBackend) Write(_ context.Context, field string, expect int64, data, audit []byte) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.records[field]
	if expect >= 0 && expect != cur.Rev {
		return 0, fmt.Errorf("%w (it is %d)", ErrConflict, cur.Rev)
	}
	if data == nil && !ok {
		return 0, ErrNotFound
	}
	if m.readOnly {
		return 0, errors.New("clients file: opened to read only")
	}
	j := journalLine{Version: m.version + 1, Field: field, Data: data, At: time.Now().UTC(), Audit: audit}
	if m.path != "" {
		if m.file == nil {
			return 0, errors.New("clients file: closed")
		}
		b, err := json.Marshal(j)
		if err != nil {
			return 0, err
		}
		if _, err := m.file.Write(append(b, '\n')); err != nil {
			return 0, fmt.Errorf("clients file: %w", err)
		}
		if err := m.file.Sync(); err != nil {
			return 0, fmt.Errorf("clients file: %w", err)
		}
	}
	m.apply(j)
	if m.path != "" && m.lines > 2*len(m.records)+1000 {
		if err := m.compact(); err != nil {
			return j.Version, nil // (written and synced; the journal stays long until a compaction works)
		}
	}
	return j.Version, nil
}

func (m *MemoryBackend) Audit(_ context.Context, before int64, n int) ([]AuditEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []AuditEntry
	for i := len(m.audit) - 1; i >= 0 && len(out) < n; i-- {
		if before > 0 && m.audit[i].Version >= before {
			continue
		}
		out = append(out, m.audit[i])
	}
	return out, nil
}
