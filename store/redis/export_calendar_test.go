package redis

import "time"

// SetInstanceClock makes s pass calendar windows around f's time instead of its own clock's: an
// instance whose clock is not Redis's (or not the one its Clock option gives the scripts).
func SetInstanceClock(s *Store, f func() time.Time) { s.instanceClock = f }
