// Package fleet simulates a fleet of pisync daemons in one process against one
// JetStream cluster, to measure what the cluster pays per host and what a restart
// storm costs it (docs/capacity.md, `make fleet`).
//
// Each virtual host is the wiring of `pisync run`: its own NATS connection dialled with
// natsconn's policy, provisioning, its own checkpoint store in its own state directory,
// the real publisher and the real watcher over its own session root. Only the kernel's
// notifications are simulated (see feed), and the parts of the daemon that do not talk
// to the cluster (HTTP, memory release) are left out.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/natsconn"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/publisher"
	"github.com/pisync/pisync/watcher"
)

// Kind is what a host's Pi does during the run.
type Kind int

const (
	Idle        Kind = iota // every session mirrored long ago; nothing written
	Appending               // one conversation going on, a line every few seconds
	Backfilling             // started over sessions never mirrored
)

func (k Kind) String() string { return [...]string{"idle", "appending", "backfilling"}[k] }

// Host is one simulated daemon.
type Host struct {
	Name  string
	Kind  Kind
	Root  string // session root
	State string // state directory

	url       string
	replicas  int
	reconnect natsconn.Backoff
	ackWait   time.Duration
	log       *zap.Logger

	disconnected, reconnected atomic.Int64 // unix nanoseconds of the last of each

	nc      *nats.Conn
	store   *checkpoint.Store
	pub     *publisher.Publisher
	feed    atomic.Pointer[feed] // replaced at each start; the writer reads it
	cancel  context.CancelFunc
	done    chan error
	watched *watcher.Watcher
}

// start wires and starts the daemon as `pisync run` does, in the same order.
func (h *Host) start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			h.abort()
		}
	}()
	owner, err := mirror.NewOwner("fleet", h.Name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.State, 0o700); err != nil {
		return err
	}
	// The handlers replace natsconn's (which only log and count) to time the storm.
	if h.nc, err = natsconn.Dial(ctx, h.url, "pisync run "+h.Name, time.Minute, h.log, nil,
		nats.CustomInboxPrefix(owner.InboxPrefix()), h.reconnect.Option(),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { h.disconnected.Store(time.Now().UnixNano()) }),
		nats.ReconnectHandler(func(*nats.Conn) { h.reconnected.Store(time.Now().UnixNano()) }),
	); err != nil {
		return err
	}
	js, err := publisher.NewJetStream(h.nc, h.ackWait, 1024)
	if err != nil {
		return err
	}
	names := mirror.DefaultNames()
	if err := mirror.Provision(ctx, js, names, mirror.Config{Replicas: h.replicas}); err != nil {
		return fmt.Errorf("%s: provision: %w", h.Name, err)
	}
	if h.store, _, err = checkpoint.Open(filepath.Join(h.State, "checkpoints"), nil); err != nil {
		return err
	}
	h.pub, err = publisher.New(ctx, publisher.Options{
		JS: js, Names: names, Owner: owner, Host: h.Name, Checkpoints: h.store,
		Logger: h.log.Named("publisher"), AckTimeout: h.ackWait,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	h.pub.Start()
	events := newFeed()
	h.feed.Store(events)
	h.watched, err = watcher.New(watcher.Options{
		Roots: []string{h.Root}, Sink: h.pub, Logger: h.log.Named("watcher"),
		RescanInterval: watcher.DefaultRescanInterval, Events: events,
	})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.watched.Run(wctx) }()
	go func() {
		select {
		case <-h.watched.Ready():
			_, _ = h.pub.PruneCheckpoints(wctx, []string{h.Root})
		case <-wctx.Done():
		}
	}()
	return nil
}

// stop shuts the daemon down as `pisync run` does: stop reading, drain, save, close.
func (h *Host) stop() error {
	h.cancel()
	var errs []error
	if err := <-h.done; err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs = append(errs, h.pub.Close(ctx), h.store.Close())
	h.nc.Close()
	return errors.Join(errs...)
}

func (h *Host) abort() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
	}
	if h.pub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = h.pub.Close(ctx)
		cancel()
	}
	if h.store != nil {
		_ = h.store.Close()
	}
	if h.nc != nil {
		h.nc.Close()
	}
}

// ready reports whether the first scan is over.
func (h *Host) ready() bool {
	select {
	case <-h.watched.Ready():
		return true
	default:
		return false
	}
}

// mirrored returns the bytes of the host's sessions the mirror has acknowledged, and
// whether nothing is waiting.
func (h *Host) mirrored() (acked int64, idle bool) {
	p := h.pub.Progress()
	r := p.Roots[h.Root]
	if r == nil {
		return 0, false
	}
	return r.MirroredBytes, r.Pending == 0 && r.BacklogBytes == 0 && p.InFlight == 0
}
