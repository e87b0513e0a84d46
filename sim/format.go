package sim

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// The output schema. `sluice simulate --format csv|json` and the browser simulation write rows
// and summaries in it; keep it stable. Times and durations are milliseconds, written exactly from
// µs: up to 3 decimals, no trailing zeros (200, 0.001, 6825.5), as JSON numbers, not strings.
//
// A row (CSV columns in this order; JSON object keys the same):
//
//	t_ms            the request's virtual time
//	key             the client
//	cost            the request's cost
//	allowed         true or false
//	remaining       requests of cost 1 that could still be approved at t_ms, after this one
//	retry_after_ms  0 when allowed; when refused, the exact wait until the same request would
//	                be approved; -1 when its cost can never fit under the policy
//	delay_ms        how long an allowed request is held before it is served (leaky bucket)
//	instance        with a Fleet only: the instance that decided it, from 1 (JSON: left out
//	                without a Fleet; CSV: a last column that `sluice simulate --instances` adds)
//	actual, balance with real costs only (Options.Actual; JSON: left out for a request without one;
//	                CSV: two last columns, SettledCSVHeader, that `sluice simulate` adds for a
//	                trace with an actual column): the request's real cost, and the remaining its
//	                settlement left (never below 0); empty in CSV for a request without one
//	end_ms,         with durations only (Options.Durations; JSON: left out without them; CSV: four
//	in_flight,      last columns, StreamCSVHeader, that `sluice simulate` adds for a trace with a
//	reserved,       duration_ms column or a workload): when the request's response ended, and it
//	wait_ms         was settled (its actual and balance are then; t_ms if refused); the responses of its key
//	                running once it was decided, and Σ their estimates; and if its settlement
//	                left the key nothing, the wait before a request of cost 1 could pass
//	fallback        in a Fleet's Outage only: open, local or closed, how the instance decided
//	                without its store (JSON: left out when the store decided; CSV: a last
//	                column that `sluice simulate --outage` adds, empty when the store decided)
//	latency_ms      with a Fleet's StoreLatency only: the request's wait for the shared store,
//	                its instance's calls to it × the latency (0 for a budget's unit spent
//	                locally); a last CSV column that `sluice simulate --store-latency` adds
//
// A summary (JSON object keys):
//
//	offered, allowed, refused   request counts; offered = allowed + refused
//	delayed                     allowed requests with delay_ms > 0
//	never                       refused requests whose cost can never fit (counted in refused too)
//	offered_cost, allowed_cost  Σ cost of the offered and of the allowed requests
//	max_delay_ms                the longest delay_ms
//	total_delay_ms              Σ delay_ms (the mean delay is total_delay_ms / delayed)
//	settled, settled_cost,      with real costs only: the approved requests settled, Σ their
//	actual_cost                 estimates (cost) and Σ their real costs
//	fallback                    only when some were: {"open","local","closed"}, the requests
//	                            decided without the store in a Fleet's Outage, by failure mode
//	max_latency_ms,             with a Fleet's StoreLatency only: the longest and the Σ of
//	total_latency_ms            the rows' latency_ms

// CSVHeader returns the CSV header of rows: t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms.
func CSVHeader() []string {
	return []string{"t_ms", "key", "cost", "allowed", "remaining", "retry_after_ms", "delay_ms"}
}

// CSVRecord returns r's fields in the order of CSVHeader.
func (r Row) CSVRecord() []string {
	return []string{FormatMillis(r.TMicros), r.Key, strconv.FormatInt(r.Cost, 10), strconv.FormatBool(r.Allowed),
		strconv.FormatInt(r.Remaining, 10), r.retryAfterMillis(), FormatMillis(r.DelayMicros)}
}

// SettledCSVHeader returns the CSV columns of real costs: actual,balance.
func SettledCSVHeader() []string { return []string{"actual", "balance"} }

// SettledCSVRecord returns r's fields in the order of SettledCSVHeader (empty if r had no real cost).
func (r Row) SettledCSVRecord() []string {
	if !r.Settles {
		return []string{"", ""}
	}
	return []string{strconv.FormatInt(r.Actual, 10), strconv.FormatInt(r.Balance, 10)}
}

// StreamCSVHeader returns the CSV columns of durations: end_ms,in_flight,reserved,wait_ms.
func StreamCSVHeader() []string { return []string{"end_ms", "in_flight", "reserved", "wait_ms"} }

// StreamCSVRecord returns r's fields in the order of StreamCSVHeader (empty without durations).
func (r Row) StreamCSVRecord() []string {
	if !r.Streams {
		return []string{"", "", "", ""}
	}
	return []string{FormatMillis(r.EndMicros), strconv.FormatInt(r.InFlight, 10), strconv.FormatInt(r.Reserved, 10), FormatMillis(r.WaitMicros)}
}

func (r Row) retryAfterMillis() string {
	if r.RetryAfterMicros == NeverMicros {
		return "-1"
	}
	return FormatMillis(r.RetryAfterMicros)
}

// MarshalJSON writes r as {"t_ms":..,"key":..,"cost":..,"allowed":..,"remaining":..,
// "retry_after_ms":..,"delay_ms":..} (see the schema above).
func (r Row) MarshalJSON() ([]byte, error) {
	var actual, balance *int64
	if r.Settles {
		actual, balance = &r.Actual, &r.Balance
	}
	var latency json.Number
	if r.HasLatency {
		latency = json.Number(FormatMillis(r.LatencyMicros))
	}
	var st *streamJSON
	if r.Streams {
		st = &streamJSON{json.Number(FormatMillis(r.EndMicros)), r.InFlight, r.Reserved, json.Number(FormatMillis(r.WaitMicros))}
	}
	return json.Marshal(struct {
		TMs          json.Number `json:"t_ms"`
		Key          string      `json:"key"`
		Cost         int64       `json:"cost"`
		Allowed      bool        `json:"allowed"`
		Remaining    int64       `json:"remaining"`
		RetryAfterMs json.Number `json:"retry_after_ms"`
		DelayMs      json.Number `json:"delay_ms"`
		Instance     int         `json:"instance,omitempty"`
		Actual       *int64      `json:"actual,omitempty"`
		Balance      *int64      `json:"balance,omitempty"`
		*streamJSON
		Fallback  string      `json:"fallback,omitempty"`
		LatencyMs json.Number `json:"latency_ms,omitempty"`
	}{json.Number(FormatMillis(r.TMicros)), r.Key, r.Cost, r.Allowed, r.Remaining,
		json.Number(r.retryAfterMillis()), json.Number(FormatMillis(r.DelayMicros)), r.Instance, actual, balance, st, r.Fallback, latency})
}

// MarshalJSON writes s as {"offered":..,"allowed":..,"refused":..,"delayed":..,"never":..,
// "offered_cost":..,"allowed_cost":..,"max_delay_ms":..,"total_delay_ms":..} (see the schema above).
func (s Summary) MarshalJSON() ([]byte, error) {
	var settled, settledCost, actualCost *int64
	if s.Settled > 0 {
		settled, settledCost, actualCost = &s.Settled, &s.SettledCost, &s.ActualCost
	}
	var maxLatency, totalLatency json.Number
	if s.Latency {
		maxLatency, totalLatency = json.Number(FormatMillis(s.MaxLatencyMicros)), json.Number(FormatMillis(s.TotalLatencyMicros))
	}
	var fb *fallbacks
	if s.Open+s.Local+s.Closed > 0 {
		fb = &fallbacks{s.Open, s.Local, s.Closed}
	}
	return json.Marshal(struct {
		Offered      int64       `json:"offered"`
		Allowed      int64       `json:"allowed"`
		Refused      int64       `json:"refused"`
		Delayed      int64       `json:"delayed"`
		Never        int64       `json:"never"`
		OfferedCost  int64       `json:"offered_cost"`
		AllowedCost  int64       `json:"allowed_cost"`
		MaxDelayMs   json.Number `json:"max_delay_ms"`
		TotalDelayMs json.Number `json:"total_delay_ms"`
		Settled      *int64      `json:"settled,omitempty"`
		SettledCost  *int64      `json:"settled_cost,omitempty"`
		ActualCost   *int64      `json:"actual_cost,omitempty"`
		Fallback     *fallbacks  `json:"fallback,omitempty"`
		MaxLatency   json.Number `json:"max_latency_ms,omitempty"`
		TotalLatency json.Number `json:"total_latency_ms,omitempty"`
	}{s.Offered, s.Allowed, s.Refused, s.Delayed, s.Never, s.OfferedCost, s.AllowedCost,
		json.Number(FormatMillis(s.MaxDelayMicros)), json.Number(FormatMillis(s.TotalDelayMicros)), settled, settledCost, actualCost, fb, maxLatency, totalLatency})
}

// streamJSON is a row's fields with durations (Row.Streams).
type streamJSON struct {
	EndMs    json.Number `json:"end_ms"`
	InFlight int64       `json:"in_flight"`
	Reserved int64       `json:"reserved"`
	WaitMs   json.Number `json:"wait_ms"`
}

// fallbacks is a summary's "fallback": its requests decided without the store, by failure mode.
type fallbacks struct {
	Open   int64 `json:"open"`
	Local  int64 `json:"local"`
	Closed int64 `json:"closed"`
}

// FormatMillis writes µs as milliseconds, exactly: up to 3 decimals, no trailing zeros
// (200000 → "200", 1 → "0.001", 6825500 → "6825.5").
func FormatMillis(us int64) string {
	sign := ""
	u := uint64(us)
	if us < 0 {
		sign, u = "-", -u
	}
	ms := sign + strconv.FormatUint(u/1000, 10)
	if frac := u % 1000; frac != 0 {
		ms += strings.TrimRight("."+strconv.FormatUint(1000+frac, 10)[1:], "0")
	}
	return ms
}

// FormatDuration writes µs for people, as time.Duration does but without zero tails: "7s",
// "6.825s", "1m30s", "1m", "2h", "250ms".
func FormatDuration(us int64) string {
	s := (time.Duration(us) * time.Microsecond).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
