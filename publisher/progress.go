package publisher

import (
	"maps"
	"time"

	"github.com/pisync/pisync/watcher"
)

// RootProgress is how far the files under one root are mirrored.
type RootProgress struct {
	Sessions      int   `json:"sessions"`       // session files known (deleted ones excluded)
	Mirrored      int   `json:"mirrored"`       // fully acknowledged, no line waiting
	Pending       int   `json:"pending"`        // lines waiting
	Torn          int   `json:"torn"`           // holding a torn tail
	Deleted       int   `json:"deleted"`        // gone locally, kept in the mirror
	Skipped       int   `json:"skipped"`        // not sessions
	Bytes         int64 `json:"bytes"`          // file sizes
	MirroredBytes int64 `json:"mirrored_bytes"` // acknowledged bytes
	BacklogBytes  int64 `json:"backlog_bytes"`  // complete lines not acknowledged
	TornBytes     int64 `json:"torn_bytes"`
}

// Progress is a snapshot of the publisher's state.
type Progress struct {
	Roots         map[string]*RootProgress `json:"roots"`
	OldestUnacked time.Time                `json:"oldest_unacked,omitempty"`
	InFlight      int                      `json:"in_flight"`
}

// Progress computes the current progress per root. A file whose Open is under way
// (found, or reopened after a move or a rewrite) counts as pending under the root it is
// opened at, its whole size as backlog: its state, if any, describes it as it was, and its
// lines are compared with the mirror (and its head follows a move) only once the Open is
// done: an Open waiting on a request that a server restart cut must not read as caught up.
func (p *Publisher) Progress() Progress {
	out := Progress{Roots: map[string]*RootProgress{}}
	root := func(name string) *RootProgress {
		r := out.Roots[name]
		if r == nil {
			r = &RootProgress{}
			out.Roots[name] = r
		}
		return r
	}
	p.mu.Lock() // one snapshot of both: an Open that ends registers its state
	opening := make(map[watcher.FileID]watcher.File, len(p.openingAt))
	maps.Copy(opening, p.openingAt)
	files := p.filesLocked()
	p.mu.Unlock()
	for _, f := range opening {
		r := root(f.Root)
		r.Sessions++
		r.Pending++
		r.Bytes += f.Size
		r.BacklogBytes += f.Size
	}
	for _, st := range files {
		st.mu.Lock()
		if _, ok := opening[st.file.ID]; ok && !st.skipped && !st.gone {
			st.mu.Unlock()
			continue // counted above, as it is being opened
		}
		r := root(st.file.Root)
		switch {
		case st.skipped:
			r.Skipped++
		case st.gone:
			r.Deleted++
		default:
			r.Sessions++
			size := max(st.file.Size, st.acked.Offset, st.seenEnd+st.torn)
			r.Bytes += size
			r.MirroredBytes += st.acked.Offset
			backlog := size - st.acked.Offset - st.torn
			if len(st.queue) > 0 {
				backlog = max(backlog, st.queue[len(st.queue)-1].end-st.acked.Offset)
			}
			r.BacklogBytes += max(backlog, 0)
			if st.torn > 0 {
				r.Torn++
				r.TornBytes += st.torn
			}
			if len(st.queue) == 0 && backlog <= 0 {
				r.Mirrored++
			} else {
				r.Pending++
			}
			out.InFlight += len(st.queue)
			if o := st.oldestSeen(); !o.IsZero() && (out.OldestUnacked.IsZero() || o.Before(out.OldestUnacked)) {
				out.OldestUnacked = o
			}
		}
		st.mu.Unlock()
	}
	p.mu.Lock()
	for name, n := range p.forgotten {
		root(name).Deleted += n
	}
	p.mu.Unlock()
	return out
}

// FileInfo describes one mirrored session file.
type FileInfo struct {
	Root, Path string
	Key        string // conversation key in the mirror
	Synced     bool   // every line read is acknowledged
}

// Files lists the session files being mirrored (not skipped, not deleted).
func (p *Publisher) Files() []FileInfo {
	var out []FileInfo
	for _, st := range p.snapshotFiles() {
		st.mu.Lock()
		if !st.skipped && !st.gone {
			out = append(out, FileInfo{Root: st.file.Root, Path: st.file.Path, Key: st.conv.Key, Synced: len(st.queue) == 0})
		}
		st.mu.Unlock()
	}
	return out
}
