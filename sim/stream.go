package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// StreamSession is a Session whose requests' responses last a while (Options.Durations): an
// approved one holds its estimate until its response ends, and is settled then. It is its own
// type, so that the browser simulation, whose sessions have no durations, does not link it.
//
// A StreamSession is not safe for concurrent use.
type StreamSession struct {
	s       *Session
	held    []held          // the responses still running, by end, then request
	running map[string]load // per key: what its running responses hold
	ended   []Ended         // settled since the last call to Ended
}

// NewStreamSession is NewSession for requests whose responses last a while (see Options).
func (o Options) NewStreamSession(policy sluice.Policy, keys int) (*StreamSession, error) {
	s, err := o.NewSession(policy, keys)
	if err != nil {
		return nil, err
	}
	return &StreamSession{s: s, running: map[string]load{}}, nil
}

// held is an approved request whose response is still running: its estimate stays charged
// until the response ends at end, when it is settled with its real cost.
type held struct {
	end    int64 // µs
	seq    int   // its place among the session's requests, from 0
	actual int64 // NoActual: the estimate stands
	lim    *sluice.Limiter
	r      *sluice.Reservation
	row    Row
}

// load is what one key's running responses hold: how many, and Σ their estimates.
type load struct{ streams, reserved int64 }

// Ended is the row of a request whose response ran for a while (DecideStream), completed by its
// settlement when the response ended: Seq is the request's place among the session's, from 0.
type Ended struct {
	Seq int
	Row Row
}

// DecideStream is DecideSettled for a request whose response lasts durMicros (≥ 0; 0: it is
// served at once). First it settles the running responses that end at or before rq's time (see
// Ended), then decides rq. Approved with a duration, rq holds its estimate while its response
// runs: the returned row is Held, and its settlement, with actual (NoActual: the estimate
// stands), comes when the clock reaches rq.TMicros + durMicros — at a later request, a Peek or
// SettleUntil — and its completed row then from Ended. Every row it returns says what the key's
// running responses hold once it is decided (Row.Streams).
func (st *StreamSession) DecideStream(rq Request, actual, durMicros int64) (Row, error) {
	s := st.s
	if durMicros < 0 || durMicros > MaxTimeMicros-max(0, rq.TMicros) {
		return Row{}, fmt.Errorf("sim: request %d: duration %d µs must be ≥ 0 and end by 2^53 µs", s.n+1, durMicros)
	}
	// (Before reserve checks rq: no response still running ends before the last instant decided.)
	if err := st.settleUntil(rq.TMicros); err != nil {
		return Row{}, err
	}
	row, lim, r, err := s.reserve(rq, actual)
	if err != nil {
		return Row{}, err
	}
	lasts := durMicros > 0 && row.Allowed
	row.Streams, row.EndMicros = true, rq.TMicros // a refused request has no response
	switch {
	case lasts:
		row.EndMicros += durMicros
		row.held = true
	case actual != NoActual:
		err := s.settle(lim, r, &row)
		if err == nil {
			err = s.wait(lim, &row)
		}
		if err != nil {
			return Row{}, fmt.Errorf("sim: request %d (t_ms %s, key %q): settling: %w", s.n+1, FormatMillis(rq.TMicros), rq.Key, err)
		}
	}
	l := st.running[rq.Key]
	if lasts {
		l.streams++
		l.reserved += rq.Cost
		st.running[rq.Key] = l
	}
	row.InFlight, row.Reserved = l.streams, l.reserved
	if lasts {
		st.hold(held{end: row.EndMicros, seq: s.n, actual: actual, lim: lim, r: r, row: row})
	}
	s.n++
	return row, nil
}

// wait records, for an approved request whose settlement left its key nothing, how long the key
// must wait for a request of cost 1: a probe, which, refused, changes nothing. A Fleet's
// instances are not probed: one could take a budget from the store for it.
func (s *Session) wait(lim *sluice.Limiter, row *Row) error {
	if !row.Allowed || row.Balance > 0 || s.limiters != nil {
		return nil
	}
	d, err := lim.AllowN(s.ctx, row.Key, 1)
	switch {
	case err != nil:
		return fmt.Errorf("probing its wait: %w", err)
	case d.Allowed: // Remaining 0 said no request of cost 1 could pass
		return errors.New("a probe of cost 1 passed with nothing remaining")
	}
	row.WaitMicros = micros(d.RetryAfter)
	return nil
}

// hold keeps h until its response ends, in order of ends (then of requests: h is the latest).
func (st *StreamSession) hold(h held) {
	i := len(st.held)
	for i > 0 && st.held[i-1].end > h.end {
		i--
	}
	st.held = append(st.held, held{})
	copy(st.held[i+1:], st.held[i:])
	st.held[i] = h
}

// settleUntil settles, in order, the held requests whose responses end at or before tMicros,
// each at its end on the virtual clock, and keeps their rows for Ended.
func (st *StreamSession) settleUntil(tMicros int64) error {
	s := st.s
	for len(st.held) > 0 && st.held[0].end <= tMicros {
		h := st.held[0]
		st.held = st.held[1:]
		s.last = h.end
		s.clock.Set(time.UnixMicro(s.origin + h.end))
		if l := st.running[h.row.Key]; l.streams > 1 {
			st.running[h.row.Key] = load{l.streams - 1, l.reserved - h.row.Cost}
		} else {
			delete(st.running, h.row.Key)
		}
		row := h.row
		row.held = false
		if h.actual != NoActual {
			err := s.settle(h.lim, h.r, &row)
			if err == nil {
				err = s.wait(h.lim, &row)
			}
			if err != nil {
				return fmt.Errorf("sim: request %d (t_ms %s, key %q): settling at its end, %s ms: %w",
					h.seq+1, FormatMillis(row.TMicros), row.Key, FormatMillis(h.end), err)
			}
		}
		st.ended = append(st.ended, Ended{Seq: h.seq, Row: row})
	}
	return nil
}

// SettleUntil settles the responses still running that end at or before tMicros, each at its
// end, in order of ends; their rows are then in Ended. It returns an error if tMicros is before
// the last instant decided or peeked at.
func (st *StreamSession) SettleUntil(tMicros int64) error {
	if tMicros < st.s.last {
		return fmt.Errorf("sim: settling until %s ms, before the last instant decided, %s ms", FormatMillis(tMicros), FormatMillis(st.s.last))
	}
	return st.settleUntil(tMicros)
}

// Peek is Session.Peek after SettleUntil(tMicros).
func (st *StreamSession) Peek(tMicros int64, key string) (sluice.Decision, error) {
	if err := st.SettleUntil(tMicros); err != nil {
		return sluice.Decision{}, err
	}
	return st.s.Peek(tMicros, key)
}

// Ended returns the rows of the requests whose responses have ended (and been settled) since the
// last call, in the order of their ends.
func (st *StreamSession) Ended() []Ended {
	e := st.ended
	st.ended = nil
	return e
}

// simulate decides reqs on st in turn, passing each row to emit (may be nil) in request order:
// a row whose response is still running waits, with the rows after it, until the response has
// ended and been settled. The run ends with every response settled.
func (st *StreamSession) simulate(reqs []Request, emit func(Row) error, actuals, durations []int64) (Summary, error) {
	var sum Summary
	var rows []Row // decided, not yet emitted: rows[0] is request done's
	done := 0
	flush := func() error {
		for _, e := range st.Ended() {
			rows[e.Seq-done] = e.Row
		}
		n := 0
		for ; n < len(rows) && !rows[n].held; n++ {
			sum.Add(rows[n])
			sum.addStream(rows[n])
			if emit != nil {
				if err := emit(rows[n]); err != nil {
					return err
				}
			}
		}
		rows = rows[:copy(rows, rows[n:])]
		done += n
		return nil
	}
	for i, rq := range reqs {
		actual, dur := NoActual, int64(0)
		if i < len(actuals) {
			actual = actuals[i]
		}
		if i < len(durations) {
			dur = durations[i]
		}
		row, err := st.DecideStream(rq, actual, dur)
		if err != nil {
			return sum, err
		}
		rows = append(rows, row)
		if err := flush(); err != nil {
			return sum, err
		}
	}
	if err := st.SettleUntil(MaxTimeMicros); err != nil {
		return sum, err
	}
	return sum, flush()
}
