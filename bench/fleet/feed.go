package fleet

import (
	"sync"

	"github.com/fsnotify/fsnotify"

	"github.com/pisync/pisync/watcher"
)

// feed is the watcher's event source in the simulator: the notifications the kernel
// would send for the writes of the simulated Pi, delivered by the writer itself.
// inotify allows 128 instances per user on the benchmark machine, so a process cannot
// hold one real watcher per host for hundreds of hosts; everything after the
// notification (the watcher's scans, reads and settle checks, the publisher) is the
// daemon's own code.
type feed struct {
	events chan fsnotify.Event
	errors chan error
	once   sync.Once
	closed chan struct{}
}

var _ watcher.EventSource = (*feed)(nil)

func newFeed() *feed {
	return &feed{events: make(chan fsnotify.Event, 256), errors: make(chan error), closed: make(chan struct{})}
}

func (f *feed) Add(string) error              { return nil }
func (f *feed) Remove(string) error           { return nil }
func (f *feed) Events() <-chan fsnotify.Event { return f.events }
func (f *feed) Errors() <-chan error          { return f.errors }

// Close is called by the watcher when it stops; the channels stay open (a writer may
// still be sending) and sends after it are dropped.
func (f *feed) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

// wrote notifies a write to path (a creation when created), as inotify would.
func (f *feed) wrote(path string, created bool) {
	op := fsnotify.Write
	if created {
		op = fsnotify.Create | fsnotify.Write
	}
	select {
	case f.events <- fsnotify.Event{Name: path, Op: op}:
	case <-f.closed:
	}
}
