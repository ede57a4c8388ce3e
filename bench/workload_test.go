package bench

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/natstest"
	"github.com/pisync/pisync/publisher"
	"github.com/pisync/pisync/session"
	"github.com/pisync/pisync/session/sessiontest"
	"github.com/pisync/pisync/watcher"
)

var (
	sessions = flag.Int("sessions", 200, "sessions in the back-fill workload")
	entries  = flag.Int("entries", 500, "entries per session in the back-fill workload")
)

// workload is a tree of session files written once per benchmark process.
type workload struct {
	root  string
	lines int   // complete lines, headers included
	bytes int64 // file bytes
}

var (
	workloadOnce sync.Once
	theWorkload  workload
)

// backfillWorkload writes sessions × entries lines with sizes drawn from 200 B to 8 KiB and
// about one line in 500 above 100 KiB, the way Pi writes them.
func backfillWorkload(b *testing.B) workload {
	b.Helper()
	workloadOnce.Do(func() {
		n, m := *sessions, *entries
		if testing.Short() {
			n, m = 10, 50
		}
		dir, err := os.MkdirTemp("", "pisync-bench-")
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(42, 42))
		w := workload{root: dir}
		for i := range n {
			cwd := "/home/dev/repo-" + strconv.Itoa(i%17)
			f := sessiontest.New(rng, dir, cwd, sessiontest.Format(i%3))
			lines := [][]byte{f.HeaderLine(cwd)}
			for range m {
				size := 200 + rng.IntN(8<<10-200)
				if rng.IntN(500) == 0 {
					size = 100<<10 + rng.IntN(200<<10)
				}
				lines = append(lines, f.Message(size))
			}
			// One write per file: the writing cost is not what is measured here.
			content := make([]byte, 0, 64<<10)
			for _, l := range lines {
				content = append(append(content, l...), '\n')
			}
			if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(f.Path, content, 0o644); err != nil {
				b.Fatal(err)
			}
			w.lines += len(lines)
			w.bytes += int64(len(content))
		}
		theWorkload = w
	})
	if theWorkload.root == "" {
		b.Fatal("workload not written")
	}
	return theWorkload
}

// rawPublish publishes every line of the workload with PublishMsgAsync — the same
// subjects, headers and bodies pisync sends, under the same window — and waits for every
// acknowledgement. It is the ceiling pisync is measured against.
func rawPublish(b *testing.B, js jetstream.JetStream, w workload, window int) {
	b.Helper()
	names := mirror.DefaultNames()
	owner, _ := mirror.NewOwner("bench", "raw")
	sem := make(chan struct{}, window)
	var wg sync.WaitGroup
	var failed sync.Once
	err := filepath.WalkDir(w.root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		content, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var conv mirror.Conv
		ordinal := int64(0)
		for len(content) > 0 {
			i := indexNL(content)
			line := content[:i]
			content = content[i+1:]
			if ordinal == 0 {
				h, err := session.ParseHeader(line)
				if err != nil {
					return err
				}
				conv, _ = mirror.NewConv(owner, h.ID)
			}
			msg := names.NewMsg(conv, mirror.Line{Kind: mirror.KindEntry, EntryID: mirror.OrdinalID(ordinal),
				Ordinal: ordinal, Generation: 1, SHA256: "0", Format: "v3", Host: "bench", Source: "s"}, line)
			ordinal++
			sem <- struct{}{}
			fut, err := js.PublishMsgAsync(msg)
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-fut.Ok():
				case err := <-fut.Err():
					failed.Do(func() { b.Errorf("raw publish: %v", err) })
				}
				<-sem
			}()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	wg.Wait()
}

func indexNL(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return len(b)
}

// pisyncBackfill runs the watcher and publisher over the workload until every byte is
// acknowledged.
func pisyncBackfill(b *testing.B, nc *nats.Conn, w workload, window int) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, err := publisher.NewJetStream(nc, 10*time.Second, window)
	if err != nil {
		b.Fatal(err)
	}
	store, _, err := checkpoint.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	owner, _ := mirror.NewOwner("bench", "pisync")
	pub, err := publisher.New(ctx, publisher.Options{JS: js, Names: mirror.DefaultNames(), Owner: owner,
		Host: "bench", Checkpoints: store, WindowMessages: window})
	if err != nil {
		b.Fatal(err)
	}
	pub.Start()
	wat, err := watcher.New(watcher.Options{Roots: []string{w.root}, Sink: pub, RescanInterval: 0})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- wat.Run(ctx) }()
	for {
		p := pub.Progress()
		var mirrored int64
		for _, r := range p.Roots {
			mirrored += r.MirroredBytes
		}
		if mirrored == w.bytes {
			break
		}
		time.Sleep(2 * time.Millisecond) // completion poll; its granularity is far below the run time
	}
	cancel()
	<-done
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := pub.Close(cctx); err != nil {
		b.Fatal(err)
	}
	if err := store.Close(); err != nil {
		b.Fatal(err)
	}
}

// server starts a fresh embedded JetStream server with the mirror provisioned.
func server(b *testing.B) (*natstest.Server, *nats.Conn, jetstream.JetStream) {
	b.Helper()
	srv := natstest.Run(b)
	nc := natstest.Connect(b, srv.URL())
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mirror.Provision(ctx, js, mirror.DefaultNames(), mirror.Config{}); err != nil {
		b.Fatal(err)
	}
	return srv, nc, js
}
