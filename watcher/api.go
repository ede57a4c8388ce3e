// Package watcher finds Pi session files (*.jsonl) under one or more roots and tails
// their complete lines.
//
// It watches every directory under each root with fsnotify, backs that up with
// stat-only rescans (periodic, after an event overflow, and as a polling fallback when
// the kernel refuses more watches), follows files across renames by device and inode,
// detects truncation and replacement, and hands everything to a Sink. It knows nothing
// of NATS and never writes to a session file.
//
// Resources are bounded: a fixed pool of workers reads files that have changed (open,
// read from the last position, close: no descriptor is held between reads), a torn tail
// is remembered by its offset rather than buffered, and a line longer than
// Options.MaxInlineBytes is found by scanning without ever being held whole.
package watcher

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// FileID identifies a file across renames: device and inode.
type FileID struct{ Dev, Ino uint64 }

// String formats the id as dev:ino.
func (id FileID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// File describes one session file.
type File struct {
	Root string // the watched root it was found under (as configured, cleaned, absolute)
	Rel  string // path relative to Root, slash-separated
	Path string // absolute path
	ID   FileID
	// Lead, in Open only, is the file's beginning: its first complete lines, where a
	// header written after other records is found. Copies, safe to keep.
	Lead  *Lead
	Size  int64 // size at the time of the call
	MTime int64 // modification time at the time of the call (Unix nanoseconds)
}

// Lead is the beginning of a file as Sink.Open is given it.
type Lead struct {
	// Lines are the first complete lines, without their "\n": at most
	// session.LeadLines of them and session.LeadBytes in all (a line past that, or
	// longer than Options.MaxInlineBytes, is nil).
	Lines [][]byte
	More  bool // a complete line follows them
}

// Header is the first complete line of f (nil outside Open, or when it is too long to
// hold): the line a session file's header is, and a rewrite changes.
func (f File) Header() []byte {
	if f.Lead == nil || len(f.Lead.Lines) == 0 {
		return nil
	}
	return f.Lead.Lines[0]
}

// OpenReason says why Sink.Open is called.
type OpenReason int

const (
	// Discovered means the file is seen for the first time (startup back-fill or created later).
	Discovered OpenReason = iota
	// Moved means the same FileID was seen at a new path within the roots (renamed or
	// moved); the old path gets no Gone.
	Moved
	// Truncated means the size fell below what was already delivered or below the size
	// of the last call (the sink may have compared the file at that size), or the bytes
	// already delivered were rewritten in place (the header line or the newline ending
	// the last delivered line changed).
	Truncated
	// Replaced means the same path now holds a different FileID (atomic rename over it).
	Replaced
	// Rechecked means the file changed and the watcher cannot tell an append from a
	// rewrite by itself (its tail resumed from a Start: it never read what came before):
	// the sink compares the whole file with what it mirrored, as after Truncated, and
	// continues the same generation if nothing mirrored changed.
	Rechecked
)

// String returns the reason's lower-case name, suitable as a metric label.
func (r OpenReason) String() string {
	switch r {
	case Discovered:
		return "discovered"
	case Moved:
		return "moved"
	case Truncated:
		return "truncated"
	case Replaced:
		return "replaced"
	case Rechecked:
		return "rechecked"
	}
	return fmt.Sprintf("OpenReason(%d)", int(r))
}

// Start is the Sink's answer to Open: where to read from.
type Start struct {
	Offset  int64 // byte offset of the next line to deliver (0 = from the header line)
	Ordinal int64 // ordinal of the line at Offset (0 = header)
	Skip    bool  // don't tail this file (not a session); re-Open only if it is Truncated/Replaced
	// Wait: the first lines do not decide what the file is yet (records that precede a
	// header, the header not written yet). The file is held like one whose first line
	// is torn, and opened again with the same reason when it changes.
	Wait bool
}

// Line is one complete line.
type Line struct {
	Ordinal int64     // 0 for line 1, then 1, 2, … in file order
	Offset  int64     // byte offset of the line's first byte
	Len     int64     // length without the terminating "\n" (a "\r" before it stays part of the line)
	Data    []byte    // the bytes, without "\n"; nil when Len > Options.MaxInlineBytes (the sink then reads the section from Src with bounded memory). Valid only during the call.
	Seen    time.Time // when the watcher first read the line's last byte
	// Src is the descriptor the watcher read the line with, valid only during the call.
	// A sink that reads the line again (Data is nil) reads it here, never by path: the
	// path may name another file by then. A read shorter than Len means the file changed:
	// return an error wrapping ErrReopen, never pad.
	Src io.ReaderAt
	// SHA256 is the SHA-256 of the line's bytes as the watcher read them (the digest the
	// mirror keeps for a line, in binary); set exactly when Data is nil, valid only during
	// the call. A sink that reads the line again from Src must find bytes with this
	// digest, else return an error wrapping ErrReopen: a same-size rewrite in place
	// between the two reads leaves a full-length section of other bytes, which a check
	// of the length alone would take for the line.
	SHA256 *[sha256.Size]byte
}

// ErrReopen, returned (wrapped) by Sink.Line, asks the watcher to open the file again as
// Truncated (a rewrite) before delivering anything more: the sink found that a line no
// longer matches what it had mirrored.
var ErrReopen = errors.New("file changed under the sink: reopen")

// Sink receives what the watcher finds. Calls for one file never overlap and come in
// file order; calls for different files may run concurrently.
type Sink interface {
	// Open is called once the file's first line is complete (a file that is empty or
	// whose first line is torn is held until it completes), and again on
	// Moved/Truncated/Replaced. Returning an error means: log, count, retry later (next
	// event, rescan, or a backoff timer). A Start that does not fit the file (beyond its
	// size, or not just after a newline) is treated like an error. A sink that compares
	// the file with what it delivered before judges its first f.Size bytes only: the
	// watcher tells a later truncation from growth by that size, so a file cut back to
	// no less than it reads as grown, and lines the sink judged past it would stay.
	Open(ctx context.Context, f File, why OpenReason) (Start, error)
	// Line delivers one complete line; blocking here is how the sink applies
	// backpressure. Returning an error stops this file's tailing; it resumes from the
	// refused line on the next event, rescan or backoff timer.
	Line(ctx context.Context, f File, l Line) error
	// Torn reports a tail without "\n" of n bytes held at offset (called when it
	// changes, and with n=0 when it is resolved). It is not called for a file whose
	// first line is still torn: such a file has not been opened yet.
	Torn(f File, offset, n int64)
	// Gone reports that the file was removed or moved out of the roots (resources
	// released). It is called only for files that were opened.
	Gone(f File)
}

// SettleSink is a Sink that is told which lines the settled check (settle.go) has yet to
// confirm. A rewrite that keeps the header and the last delivered line (an earlier line
// changed, the same size) is found only by that check, once the file has been quiet for
// Options.SettleDelay; a sink that records what it was given (a checkpoint) must not take
// that record as proof of the file's lines after a restart while the check was pending:
// the check is not armed again for a file that does not change after the restart.
type SettleSink interface {
	Sink
	// Settled(f, false) is called when a run finds a change that the settled check will
	// look at, before any line of it is delivered; Settled(f, true) once that check found
	// every delivered byte in place and nothing more was delivered (f.MTime is then the
	// modification time of the content checked). An Open starts settled.
	Settled(f File, settled bool)
}

// EventSource is the stream of file-system notifications the watcher listens to. The
// default wraps an fsnotify.Watcher (see NewFSNotify); tests inject their own to
// simulate an overflow (fsnotify.ErrEventOverflow on Errors) or a watch limit (Add
// failing with syscall.ENOSPC). Add and Remove may be called from several goroutines.
type EventSource interface {
	Add(dir string) error
	Remove(dir string) error
	Events() <-chan fsnotify.Event
	Errors() <-chan error
	Close() error
}

// Options configure a Watcher. Zero values take the documented defaults.
type Options struct {
	Roots   []string
	Sink    Sink
	Logger  *zap.Logger // nil = no logs
	Metrics *Metrics    // may be nil
	// Workers is the number of reader goroutines (default 4).
	Workers int
	// MaxInlineBytes is the longest line handed over in Line.Data (default 512 KiB).
	MaxInlineBytes int64
	// ReadBuffer is the size of each worker's read buffer (default 256 KiB).
	ReadBuffer int
	// RescanInterval is the period of the safety rescan (stat only; reads nothing
	// unchanged). 0 (or less) disables it; DefaultRescanInterval is the recommended
	// value. Rescans after an overflow, of roots short of watches, and checks for missing
	// roots happen regardless.
	RescanInterval time.Duration
	// SettleDelay is how long a file must have been quiet after a change before every
	// byte delivered from it is read again and compared (settle.go): the check that
	// finds a rewrite keeping the header and the last delivered line. Negative
	// disables it (default 2s).
	SettleDelay time.Duration
	// Events is the notification source; nil = fsnotify. Run closes it when it returns.
	Events EventSource
	// MoveGrace is how long the identity of a vanished file is remembered, so that a
	// rename seen as remove-then-create is reported as Moved; Gone follows it
	// (default 2s).
	MoveGrace time.Duration
	// RootPollInterval is how often a root that does not exist (yet, or any more) is
	// checked for (default 1s).
	RootPollInterval time.Duration
	// FallbackPollInterval is how often a root is rescanned when some of its
	// directories have no watch: over WatchBudget, or refused by the kernel (default 10s).
	FallbackPollInterval time.Duration
	// WatchBudget is the most watch resources the watcher holds: with kqueue (macOS,
	// BSD) one descriptor per watched directory and per entry in it, with inotify
	// (Linux) one watch per directory. Directories past it are polled. 0 = the
	// platform's default: three quarters of RLIMIT_NOFILE with kqueue, half of
	// fs.inotify.max_user_watches on Linux, none elsewhere; negative = none. Whatever
	// the budget, a watch the kernel refuses lowers it to what is held.
	WatchBudget int

	countEntries bool // tests: count every entry of a watched directory, as kqueue does
}

// Defaults applied by New to zero fields of Options (DefaultRescanInterval excepted:
// a zero RescanInterval disables the periodic rescan).
const (
	DefaultWorkers              = 4
	DefaultMaxInlineBytes       = 512 << 10
	DefaultReadBuffer           = 256 << 10
	DefaultRescanInterval       = time.Minute
	DefaultMoveGrace            = 2 * time.Second
	DefaultSettleDelay          = 2 * time.Second
	DefaultRootPollInterval     = time.Second
	DefaultFallbackPollInterval = 10 * time.Second
	minReadBuffer               = 16
)

// normalize validates o and fills in defaults.
func (o *Options) normalize() error {
	if o.Sink == nil {
		return errors.New("watcher: no Sink")
	}
	if len(o.Roots) == 0 {
		return errors.New("watcher: no root to watch")
	}
	roots := make([]string, 0, len(o.Roots))
	for _, r := range o.Roots {
		if r == "" {
			return errors.New("watcher: empty root")
		}
		abs, err := filepath.Abs(r)
		if err != nil {
			return fmt.Errorf("watcher: root %q: %w", r, err)
		}
		dup := false
		for _, q := range roots {
			switch {
			case q == abs:
				dup = true
			case within(abs, q) || within(q, abs):
				return fmt.Errorf("watcher: roots %q and %q overlap", q, abs)
			}
		}
		if !dup {
			roots = append(roots, abs)
		}
	}
	o.Roots = roots
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Workers < 0 || o.MaxInlineBytes < 0 || o.ReadBuffer < 0 || o.MoveGrace < 0 ||
		o.RootPollInterval < 0 || o.FallbackPollInterval < 0 {
		return errors.New("watcher: negative Workers, MaxInlineBytes, ReadBuffer or interval")
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.MaxInlineBytes == 0 {
		o.MaxInlineBytes = DefaultMaxInlineBytes
	}
	if o.ReadBuffer == 0 {
		o.ReadBuffer = DefaultReadBuffer
	}
	if o.ReadBuffer < minReadBuffer {
		return fmt.Errorf("watcher: ReadBuffer %d is below %d bytes", o.ReadBuffer, minReadBuffer)
	}
	if o.SettleDelay == 0 {
		o.SettleDelay = DefaultSettleDelay
	}
	if o.MoveGrace == 0 {
		o.MoveGrace = DefaultMoveGrace
	}
	if o.RootPollInterval == 0 {
		o.RootPollInterval = DefaultRootPollInterval
	}
	if o.FallbackPollInterval == 0 {
		o.FallbackPollInterval = DefaultFallbackPollInterval
	}
	return nil
}

// within reports whether path is dir or lies below it.
func within(path, dir string) bool {
	if path == dir {
		return true
	}
	if dir == string(filepath.Separator) {
		return strings.HasPrefix(path, dir)
	}
	return strings.HasPrefix(path, dir+string(filepath.Separator))
}

// Stats is a snapshot of the watcher's counters.
type Stats struct {
	Files        int   // files known (pending, tailing or skipped)
	Pending      int   // files whose first line is not complete yet, or not opened yet
	Tailing      int   // files opened and tailed
	Skipped      int   // files the sink chose not to tail
	Dirs         int   // directories watched
	WaitingRoots int   // roots that do not exist and are polled for
	PollingRoots int   // roots rescanned periodically because watches were refused
	TornTails    int   // files holding a torn tail
	Watches      int   // watch resources held (see Options.WatchBudget)
	WatchBudget  int   // the most that may be held (0 = no budget)
	PolledDirs   int   // directories without a watch: over the budget or refused by the kernel
	PolledFiles  int   // session files in them, whose changes are found by polling
	BytesRead    int64 // bytes read from session files
	Lines        int64 // lines accepted by the sink
	Events       int64 // file-system events received
	Overflows    int64 // event overflows
	Rescans      int64 // full rescans of a root
	Errors       int64 // errors of any kind (see the errors_total metric for reasons)
}
