package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/rueidis"
)

// Replica-acknowledged decisions (Options.ReplicasAck, store.replicas_ack).
//
// Redis replicates asynchronously: a primary answers a script before any replica has its writes,
// so a primary that dies can take the last decisions' writes with it, and the replica promoted
// in its place hands that quota out again. With ReplicasAck = N, every script call whose reply
// says it consumed (a decision allowed at a cost above 0; never the checks of DecideAll across
// slots) is followed by WAIT N timeout on the same connection, and the decision is answered only
// if at least N replicas acknowledged it; otherwise the call fails with ErrStoreUnavailable (its
// charge given back, below) and the failure mode decides (fail-closed refuses, fail-open allows,
// local decides locally). A settlement is confirmed the same way (ErrUnconfirmed if not).
// Refusals and cost-0 checks write nothing and send no WAIT.
//
// Why the same connection: WAIT waits for the writes of the connection it is sent on (up to the
// replication offset of its last write), not for anyone else's. The store's usual calls share a
// few connections through rueidis's auto-pipelining, where a lone WAIT might go on another
// connection than the script it should confirm (rueidis picks a pipe per command); and a WAIT
// there would block, inside Redis, every call pipelined behind it on that connection. So a call
// to confirm takes a connection of its own (Client.Dedicate: one wire from rueidis's pool of
// dedicated connections, to the primary — on a cluster, to the node that serves the keys' slot,
// chosen by the first command), sends the script on it, and, only if the reply says it
// consumed, WAIT on the same wire. (rueidis's DoMulti of the script and WAIT would also keep them
// on one wire — WAIT is a blocking command, so it takes a dedicated one — and save a round trip,
// but every refusal would then wait for the WAIT too: for an earlier write of that pooled
// connection, if a replica is down.) A dedicated client does not follow MOVED or ASK: a call that
// meets one (a slot that moved) fails with ErrStoreUnavailable rather than run its script on one
// node and WAIT on another. A connection that failed or timed out mid-call is closed, never
// reused (its reply may still be pending).
//
// What this guarantees: an answered consuming decision reached the primary and at least N
// replicas (their replication streams; Redis acknowledges what a replica received, not what it
// persisted). Hence with Sentinel (or a cluster's replica promotion) a failover that promotes one
// of those replicas keeps it. Over-admission from a failover is then zero if the promoted replica
// is one that acknowledged: always with N equal to the number of replicas (any replica may be
// promoted), or with a single replica.
//
// What it does not guarantee (it is not strong consistency):
//   - With more replicas than N, the promoted replica may not be one that acknowledged: Sentinel
//     prefers the replica with the largest replication offset it last saw, but that reading can
//     be stale, and replica-priority or a replica cut off too long changes the choice (a
//     cluster's replicas elect themselves by offset too, with the same caveats).
//   - A replica that acknowledged still loses the write if it restarts without persistence, or
//     resyncs from a primary that lacks it.
//   - A decision that failed the WAIT did consume on the primary (and perhaps some replicas).
//     If WAIT answered (fewer replicas than N acknowledged in time), the primary was alive a
//     moment ago and holds the charge: the executor gives it back (exec.go: a settlement to 0 at
//     the decision's instant, a lease released, in the background), so that "unavailable: used
//     no quota" holds; until the give-back has run, and on a primary that then dies without it
//     reaching a replica, the quota stays spent — on the side of refusing. If WAIT got no answer
//     (the primary died or froze while the replicas were acknowledging), the charge is kept: a
//     give-back goes to whichever server is the primary when it runs, and after a failover that
//     is a replica that may never have had the charge, where it would hand out quota nobody
//     took (over-admission, what replicas_ack exists to prevent). The quota then stays spent on
//     the side of refusing, until the policy's reset at the most. For the same reason a
//     give-back after WAIT answered short is sent only while the store still sends to the
//     primary that took the charge (refundOn; outside a cluster): a failover in between keeps
//     the charge. (One that comes within the give-back's own round trip is a narrow window, not
//     closed.) A settlement that failed the WAIT was applied
//     and is not undone: it fails with sluice.ErrUnconfirmed (do not retry it), not with
//     ErrStoreUnavailable (which says nothing changed).
//   - It costs a round trip more, and the replicas' acknowledgement, on every consuming call,
//     and a connection per call in flight instead of shared pipelines (a batch of decisions
//     shares one). With fewer than N replicas connected (after a failover, until a replica is
//     replaced) every consuming decision waits out the timeout and fails.
//   - Redis checks WAIT's timeout on its event loop: with the default hz 10 it may fire up to
//     100 ms late; the call ends at SlowTimeout + ReplicasAckTimeout whatever Redis does.
//
// Redis's own alternative is min-replicas-to-write / min-replicas-max-lag on the primary: it
// refuses writes (the scripts then fail) while fewer replicas are connected with a lag within
// the bound, which limits the window of loss to about the lag, not per write; it needs no client
// support, and the two combine.

// acks is the store's WAIT configuration.
type acks struct {
	n       int64
	timeout time.Duration
	millis  int64 // WAIT's timeout argument: ≥ 1 (WAIT 0 would wait forever)
}

// maxReplicasAck bounds Options.ReplicasAck (no real deployment has more replicas).
const maxReplicasAck = 1000

func newAcks(n int, timeout, storeTimeout time.Duration) (*acks, error) {
	switch {
	case n < 0 || n > maxReplicasAck:
		return nil, fmt.Errorf("redis store: ReplicasAck %d must be from 0 (off) to %d", n, maxReplicasAck)
	case timeout < 0:
		return nil, fmt.Errorf("redis store: ReplicasAckTimeout %v must be ≥ 0 (0: the store's Timeout)", timeout)
	case n == 0:
		return nil, nil // a timeout without replicas to wait for: off
	}
	if timeout == 0 {
		timeout = storeTimeout
	}
	ms := (timeout + time.Millisecond - 1) / time.Millisecond
	a := &acks{n: int64(n), millis: int64(ms)}
	a.timeout = time.Duration(a.millis) * time.Millisecond
	return a, nil
}

// callTimeout is the bound on one store call: with replicas_ack, a call that may consume has
// ReplicasAckTimeout more, for the WAIT.
func (s *Store) callTimeout(consumes bool) time.Duration {
	if s.acks != nil && consumes {
		return s.timeout + s.acks.timeout
	}
	return s.timeout
}

// hardTimeout is the most one store call waits, while Redis answers (life.go): SlowTimeout, and
// with replicas_ack ReplicasAckTimeout more for a call that may consume.
func (s *Store) hardTimeout(consumes bool) time.Duration {
	return s.callTimeout(consumes) - s.timeout + s.slow
}

// ack asks exec to confirm a call's writes with WAIT: job.consumed says from the script's reply
// whether it wrote; err is then set to nil if enough replicas acknowledged, else to what fell
// short (the executor makes it the call's error, exec.go).
type ack struct {
	job  job
	err  error
	lost bool // WAIT got no reply (the wire broke, or the call's time ran out): see run's give-back
	// primary is the address of the primary the call was sent to, as the store saw it just before
	// ("" on a cluster): a give-back goes only there (refundOn).
	primary string
}

// exec runs p on c with keys and args: its library function (FCALL) if c calls functions
// (funcs.go), else its script. With wait nil, auto-pipelined. Otherwise on a dedicated connection
// (see above), followed there, if the reply says the call consumed, by WAIT, whose shortfall it
// reports in wait.err.
func (s *Store) exec(ctx context.Context, c *conn, p *program, keys, args []string, wait *ack) rueidis.RedisResult {
	res := s.execute(ctx, c, p, keys, args, wait)
	if res.NonRedisError() == nil {
		c.answered(c.slot(keys[0])) // Redis answered: it is alive (life.go)
	}
	return res
}

// execute is exec, without recording that Redis answered.
func (s *Store) execute(ctx context.Context, c *conn, p *program, keys, args []string, wait *ack) rueidis.RedisResult {
	if wait == nil {
		if c.functions {
			return fcall(ctx, c.client, p, keys, args)
		}
		return p.lua.Exec(ctx, c.client, keys, args)
	}
	dc, release := c.client.Dedicate()
	defer release()
	var res rueidis.RedisResult
	if c.functions {
		res = fcall(ctx, dc, p, keys, args) // (a library it loads is loaded on this wire's node)
	} else {
		res = evalsha(ctx, dc, p, keys, args)
	}
	if res.NonRedisError() != nil {
		dc.Close() // broken or timed out: its reply may still come; never reuse it
		return res
	}
	if reply, err := res.AsIntSlice(); err != nil || !wait.job.consumed(reply) {
		return res // wrote nothing (a refusal, an error): nothing to confirm
	}
	w := dc.Do(ctx, dc.B().Wait().Numreplicas(s.acks.n).Timeout(s.acks.millis).Build())
	if w.NonRedisError() != nil {
		dc.Close()
		wait.lost = true
	}
	wait.err = s.acks.shortfall(w)
	return res
}

// shortfall is nil if WAIT's reply counts enough replicas, else the error to answer with.
func (a *acks) shortfall(r rueidis.RedisResult) error {
	n, err := r.AsInt64()
	switch {
	case err == nil && n >= a.n:
		return nil
	case err == nil:
		return fmt.Errorf("%d of the %d replicas required (replicas_ack) acknowledged the change within %v", n, a.n, a.timeout)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return fmt.Errorf("the change was not acknowledged by %d replicas (replicas_ack) before the call's end: %v", a.n, err)
	}
	return fmt.Errorf("WAIT %d (replicas_ack): %v", a.n, err)
}

// checkReplicas warns, at connection, of each primary that has fewer replicas connected than
// replicas_ack waits for (ROLE): until it has them, every consuming decision there fails.
func (a *acks) checkReplicas(ctx context.Context, client rueidis.Client, timeout time.Duration, log *slog.Logger) {
	for addr, node := range client.Nodes() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
		cancel()
		if err != nil || len(role) < 3 {
			continue // not known: the decisions will say
		}
		if r, _ := role[0].ToString(); r != "master" {
			continue
		}
		if replicas, err := role[2].ToArray(); err == nil && int64(len(replicas)) < a.n {
			log.Warn("the Redis primary has fewer replicas than replicas_ack waits for: every decision that consumes fails there (the failure mode decides) until it has them",
				"primary", addr, "replicas", len(replicas), "replicas_ack", a.n)
		}
	}
}
