package watcher

import (
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// File identity: a path is owned by the file (device and inode) that is there now.
// A known inode met at a new path is Moved there, a path whose inode changed is
// Replaced, and a file whose path is gone is remembered for MoveGrace before Gone.

// resolve settles who owns path now that it holds nid. It returns false when s let go
// of the path (a known file moved there, or a race to look at again).
func (w *Watcher) resolve(s *fileState, path string, nid FileID) bool {
	w.mu.Lock()
	if s.path != path || s.dropped {
		w.mu.Unlock()
		return false
	}
	t := w.byID[nid]
	if t == nil || t == s || nid == (FileID{}) {
		w.adoptLocked(s, nid)
		w.mu.Unlock()
		return true
	}
	tPath, tVanished := t.path, t.vanished
	w.mu.Unlock()
	oldTaken := false // t's old name holds another file now
	if !tVanished {
		fi, err := os.Lstat(tPath)
		oldTaken = err == nil
		if err == nil && FileIDOf(fi) == nid {
			// Another name of a tailed inode: a hard link, or a new name whose old one
			// is about to be unlinked (link, then unlink: a move seen create-first).
			// One name of an inode is tailed; this one waits, and takes over (Moved)
			// when the other goes.
			w.mu.Lock()
			if s.path != path || s.dropped {
				w.mu.Unlock()
				return false
			}
			forget := s.inByID || s.phase != unopened
			w.aliasLocked(s, nid)
			if w.byID[nid] != t || t.vanished || t.dropped || t.path != tPath {
				w.scheduleLocked(s) // the tailed name changed meanwhile: look again
			} else {
				w.scheduleLocked(t) // an event on this name is news for the inode
			}
			w.mu.Unlock()
			if forget {
				w.sinkGone(s) // what this path held before is gone from it
			}
			return false
		}
	}
	w.mu.Lock()
	if s.path != path || s.dropped || w.byID[nid] != t || t.path != tPath || t.dropped {
		w.scheduleLocked(s)
		w.mu.Unlock()
		return false
	}
	// t moved here: it takes over the path, s lets go of it.
	w.unlinkLocked(t)
	t.vanished, t.goneDue, t.goneAt = false, false, time.Time{}
	t.path, t.rel, t.root, t.seenGen = path, s.rel, s.root, s.seenGen
	t.moved = true
	w.linkLocked(t)
	w.scheduleLocked(t)
	if oldTaken {
		// Two files swapped names, or one was renamed over the other's old name.
		w.touchLocked(t.root, tPath, nil, 0, false)
	}
	dropNow := w.letGoLocked(s)
	w.mu.Unlock()
	if dropNow {
		w.sinkGone(s)
	}
	w.log.Debug("file moved", zap.String("from", tPath), zap.String("to", path))
	return false
}

// adoptLocked gives s the identity nid.
func (w *Watcher) adoptLocked(s *fileState, nid FileID) {
	w.unaliasLocked(s)
	if s.inByID && w.byID[s.id] == s {
		delete(w.byID, s.id)
	}
	s.id, s.idKnown, s.inByID = nid, true, false
	if nid != (FileID{}) && w.byID[nid] == nil {
		w.byID[nid] = s
		s.inByID = true
	}
}

// vanish handles a path that no longer holds a regular file.
func (w *Watcher) vanish(s *fileState, path string) {
	w.mu.Lock()
	if s.path != path || s.dropped {
		w.mu.Unlock()
		return
	}
	dropNow := w.letGoLocked(s)
	w.mu.Unlock()
	if dropNow {
		w.sinkGone(s)
	}
}

// letGoLocked detaches s from its path. A file with an identity is remembered for
// MoveGrace (it may show up at another path: Moved); anything else is dropped now, and
// the caller then reports it Gone.
func (w *Watcher) letGoLocked(s *fileState) (dropNow bool) {
	w.unlinkLocked(s)
	if s.inByID {
		s.vanished = true
		s.goneAt = w.afterLocked(w.opts.MoveGrace, s, kindGone)
		w.wakeAliasesLocked(s.id)
		return false
	}
	w.dropLocked(s)
	return true
}

// dropLocked forgets s.
func (w *Watcher) dropLocked(s *fileState) {
	s.dropped, s.vanished = true, false
	w.unaliasLocked(s)
	if s.inByID && w.byID[s.id] == s {
		delete(w.byID, s.id)
		w.wakeAliasesLocked(s.id)
	}
	s.inByID = false
	w.unlinkLocked(s)
	w.setStateLocked(s, "")
}

// sinkGone tells the sink a file it knows is gone. Worker of s only.
func (w *Watcher) sinkGone(s *fileState) {
	w.resetTorn(s)
	if s.phase != unopened {
		s.phase = unopened
		w.sink.Gone(s.file)
		w.log.Debug("file gone", zap.String("path", s.file.Path))
	}
}

// linkLocked makes s the file at its path.
func (w *Watcher) linkLocked(s *fileState) {
	w.files[s.path] = s
	d := filepath.Dir(s.path)
	m := w.byDir[d]
	if m == nil {
		m = map[*fileState]struct{}{}
		w.byDir[d] = m
	}
	m[s] = struct{}{}
}

// unlinkLocked detaches s from its path (unless another file took it already).
func (w *Watcher) unlinkLocked(s *fileState) {
	if w.files[s.path] == s {
		delete(w.files, s.path)
	}
	d := filepath.Dir(s.path)
	if m := w.byDir[d]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(w.byDir, d)
		}
	}
}

// aliasLocked makes s a waiting second name of the inode nid (see resolve).
func (w *Watcher) aliasLocked(s *fileState, nid FileID) {
	if s.inByID && w.byID[s.id] == s {
		delete(w.byID, s.id)
	}
	s.inByID, s.idKnown = false, false
	s.needRun = true // rescans look again
	if s.aliasOf == nid {
		return
	}
	w.unaliasLocked(s)
	s.aliasOf = nid
	m := w.aliases[nid]
	if m == nil {
		m = map[*fileState]struct{}{}
		w.aliases[nid] = m
	}
	m[s] = struct{}{}
}

func (w *Watcher) unaliasLocked(s *fileState) {
	if s.aliasOf == (FileID{}) {
		return
	}
	if m := w.aliases[s.aliasOf]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(w.aliases, s.aliasOf)
		}
	}
	s.aliasOf = FileID{}
}

// wakeAliasesLocked queues the waiting names of id: the tailed name left.
func (w *Watcher) wakeAliasesLocked(id FileID) {
	for a := range w.aliases[id] {
		w.scheduleLocked(a)
	}
}
