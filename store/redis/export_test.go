package redis

// SetBetweenPhases makes s run f after the checks and before the commits of a DecideAll across a
// cluster's slots (a concurrent request, a node that hangs, at that very moment).
func SetBetweenPhases(s *Store, f func()) { s.betweenPhases = f }

// UsesFunctions reports whether s calls the library's functions (FCALL) rather than the scripts.
func UsesFunctions(s *Store) bool {
	c := s.conn.Load()
	return c != nil && c.functions
}

// ScriptsOnly returns opts for a store that runs the scripts (EVALSHA) even where Redis has
// Functions: the store on a server without them.
func ScriptsOnly(opts Options) Options {
	opts.scripts = true
	return opts
}

// LibraryName is the name of the store's function library.
var LibraryName = library.name

// SharesKey is the name of the hash of the instances' counts beside the registry of prefix.
func SharesKey(prefix string) string { return sharesKey(prefix, prefix+"instances", ":shares") }

// Slot is Redis Cluster's hash slot of key.
func Slot(key string) uint16 { return slot(key) }
