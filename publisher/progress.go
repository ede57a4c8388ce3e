package publisher

import "time"

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

// Progress computes the current progress per root.
func (p *Publisher) Progress() Progress {
	out := Progress{Roots: map[string]*RootProgress{}}
	for _, st := range p.snapshotFiles() {
		st.mu.Lock()
		r := out.Roots[st.file.Root]
		if r == nil {
			r = &RootProgress{}
			out.Roots[st.file.Root] = r
		}
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
	for root, n := range p.forgotten {
		r := out.Roots[root]
		if r == nil {
			r = &RootProgress{}
			out.Roots[root] = r
		}
		r.Deleted += n
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
