package publisher

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
)

// connBack tells the reconciliations that the connection to NATS is back. A file
// whose publishes failed during an outage has backed off between its attempts (up to
// RetryMax); without this, it would catch up only when its pause ends, up to half a
// minute after the cluster returned.
type connBack struct {
	mu sync.Mutex
	ch chan struct{} // closed at the next reconnection
}

// wait returns a channel closed when the connection comes back.
func (b *connBack) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *connBack) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// watch fires at each reconnection of nc until ctx ends.
func (b *connBack) watch(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn) {
	defer wg.Done()
	ch := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			b.fire()
		}
	}
}
