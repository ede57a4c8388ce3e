package publisher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// apiCounter counts the JetStream API requests and key-value writes a test's clients
// make, as the server sees them: a subscriber on the same account receives a copy of
// every request published there.
type apiCounter struct {
	nc   *nats.Conn
	mu   sync.Mutex
	byOp map[string]int
}

func countAPI(t *testing.T, url string) *apiCounter {
	t.Helper()
	c := &apiCounter{nc: natstest.Connect(t, url), byOp: map[string]int{}}
	for _, subj := range []string{"$JS.API.>", "$KV.>"} {
		if _, err := c.nc.Subscribe(subj, func(m *nats.Msg) {
			// "$JS.API.DIRECT.GET.PISYNC_ENTRIES.pisync.entries…" → "DIRECT.GET"
			op := strings.TrimPrefix(m.Subject, "$JS.API.")
			if parts := strings.SplitN(op, ".", 3); len(parts) >= 2 {
				op = parts[0] + "." + parts[1]
			}
			c.mu.Lock()
			c.byOp[op]++
			c.mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

// take returns the requests counted so far and starts again from zero.
func (c *apiCounter) take(t *testing.T) (int, map[string]int) {
	t.Helper()
	if err := c.nc.Flush(); err != nil { // every request sent before now has reached us
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	by, n := c.byOp, 0
	for _, k := range by {
		n += k
	}
	c.byOp = map[string]int{}
	return n, by
}

// TestStartCostScalesWithChangedFiles: a daemon that starts with a thousand files its
// checkpoint proves mirrored must not ask the mirror about each of them (DESIGN §6: what a
// fleet restart costs the cluster). The requests of a start are a constant plus a few per
// changed file: one stream-wide request replaces the question per file.
func TestStartCostScalesWithChangedFiles(t *testing.T) {
	const files, changed = 1000, 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	stateDir, root := t.TempDir(), t.TempDir()
	sessions := writeFiles(t, root, files)

	// run starts a publisher and a watcher on the same state, waits until every file is
	// mirrored, stops them, and returns the requests made meanwhile.
	run := func(what string) (int, map[string]int) {
		t.Helper()
		counter := countAPI(t, srv.URL())
		store := openStore(t, stateDir)
		p := startPublisher(t, ctx, srv.URL(), store)
		stop, ready := startWatcher(t, ctx, p, root)
		<-ready
		waitUntil(t, what+": every session mirrored", func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == files && pr.BacklogBytes == 0
		})
		stop()
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		n, by := counter.take(t)
		counter.nc.Close()
		t.Logf("%s: %d requests %v", what, n, by)
		return n, by
	}

	run("first start")
	idle, _ := run("restart, nothing changed")
	for _, f := range sessions[:changed] {
		if err := f.Append(f.Entry(200)); err != nil {
			t.Fatal(err)
		}
	}
	busy, _ := run("restart, 10 files changed")

	// The constant: provisioning and binding the stream and buckets, one stream-wide
	// listing. Per changed file: its last sequence, a consumer to read what follows it,
	// the publish, the head write (about 5 on a quiet machine). Under load a file can cost
	// a few more (its head written twice, a settled recheck of the append reopening it:
	// 9 a file seen once on a loaded machine); the bound is what tells O(changed files)
	// from O(all files): 15 a changed file is 150, against the 1,000 files a start that
	// asked about each would cost at least.
	if idle > 30 {
		t.Errorf("a start with %d unchanged files made %d requests; want a constant (at most 30), not one per file", files, idle)
	}
	if busy-idle > 15*changed {
		t.Errorf("a start with %d changed files made %d requests more than with none; want at most %d", changed, busy-idle, 15*changed)
	}
}
