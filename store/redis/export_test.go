package redis

// SetBetweenPhases makes s run f after the checks and before the commits of a DecideAll across a
// cluster's slots (a concurrent request, a node that hangs, at that very moment).
func SetBetweenPhases(s *Store, f func()) { s.betweenPhases = f }
