package gateway

import (
	"maps"
	"sync"
	"sync/atomic"
)

// cowMap is a map read on every request and written rarely: once per new key, and its keys are
// bounded labels (configured names). A read is an atomic load and a lookup, with no lock; a
// write copies the map.
type cowMap[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex // serialises writers
}

// get returns k's value, made by mk the first time k is asked for.
func (c *cowMap[K, V]) get(k K, mk func() V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[K]V{}
	if old := c.m.Load(); old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
		next = maps.Clone(*old)
	}
	v := mk()
	next[k] = v
	c.m.Store(&next)
	return v
}

// all returns the map as it is now. It must not be modified.
func (c *cowMap[K, V]) all() map[K]V {
	if m := c.m.Load(); m != nil {
		return *m
	}
	return nil
}
