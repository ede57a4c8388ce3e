package publisher

import "github.com/pisync/pisync/watcher"

var _ watcher.SettleSink = (*Publisher)(nil)

// Settled records whether the lines of a file are confirmed by the watcher's settled
// check, in the file's next checkpoint: a daemon stopped while the check of a change was
// pending compares the file with the mirror at the next start instead of trusting its
// checkpoint, which would otherwise prove a rewrite that kept the last line mirrored
// (only the settled check finds a rewrite that keeps header, size and last line). With
// the modification time of the content checked, the next start also knows a file written
// while no watcher ran.
func (p *Publisher) Settled(f watcher.File, settled bool) {
	st := p.state(f.ID)
	if st == nil || st.skipped || st.file.Path != f.Path {
		return
	}
	st.mu.Lock()
	changed := st.unsettled == settled || settled && st.mtime != f.MTime
	st.unsettled = !settled
	if settled {
		st.mtime = f.MTime // the content the check found in place
	}
	if changed {
		st.cpDirty = true
	}
	st.mu.Unlock()
	if changed {
		p.mark(&p.dirtyCP, st)
	}
}
