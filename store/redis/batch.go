package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

// batcher decides the requests that wait at the same moment with one script call (batch.lua)
// instead of one each, on a single server. Each of a few workers takes whatever requests are
// queued, up to max, and sends them as one call; with one request waiting a batch is that one
// request, so a quiet store adds no latency. Workers run concurrently, so batches pipeline too.
type batcher struct {
	s       *Store
	script  *rueidis.Lua
	queue   chan *call
	max     int
	stop    chan struct{}
	stopped sync.WaitGroup
}

// call is one decision waiting for its batch.
type call struct {
	keys  [2]string
	args  [5]string
	reply [6]int64
	err   error
	done  chan struct{} // closed when reply or err is set
}

const batchWorkers = 4

func newBatcher(s *Store, max int) *batcher {
	b := &batcher{s: s, script: rueidis.NewLuaScript(batchScript()), queue: make(chan *call, 4*batchWorkers*max),
		max: max, stop: make(chan struct{})}
	for i := 0; i < batchWorkers; i++ {
		b.stopped.Add(1)
		go b.work()
	}
	return b
}

var errClosed = fmt.Errorf("%w: redis store: closed", sluice.ErrStoreUnavailable)

// decide queues c and waits for its reply, or for ctx to end.
func (b *batcher) decide(ctx context.Context, c *call) error {
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return unavailable(ctx.Err())
	case <-b.stop:
		return errClosed
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return unavailable(ctx.Err()) // the worker still finishes c; nobody reads it
	}
}

func (b *batcher) work() {
	defer b.stopped.Done()
	batch := make([]*call, 0, b.max)
	keys := make([]string, 0, 2*b.max)
	args := make([]string, 0, 3+5*b.max)
	for {
		select {
		case c := <-b.queue:
			batch = append(batch[:0], c)
		case <-b.stop:
			b.drain()
			return
		}
	fill:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		keys, args = keys[:0], args[:0]
		args = append(args, strconv.Itoa(len(batch)), b.s.now(), b.s.slack)
		for _, c := range batch {
			keys = append(keys, c.keys[0], c.keys[1])
			args = append(args, c.args[:]...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.s.timeout)
		b.s.calls.Add(1)
		reply, err := b.script.Exec(ctx, b.s.client, keys, args).AsIntSlice()
		cancel()
		if err == nil && len(reply) != 6*len(batch) {
			err = fmt.Errorf("script replied %d numbers, want %d", len(reply), 6*len(batch))
		}
		for i, c := range batch {
			if err != nil {
				c.err = unavailable(err)
			} else {
				copy(c.reply[:], reply[6*i:6*i+6])
			}
			close(c.done)
		}
	}
}

// drain fails the calls still queued when the store closes.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.queue:
			c.err = errClosed
			close(c.done)
		default:
			return
		}
	}
}

func (b *batcher) close() {
	close(b.stop)
	b.stopped.Wait()
}
