package publisher

import "github.com/pisync/pisync/checkpoint"

// forgetGone returns the deleted files whose last state is recorded: every line read
// resolved, the checkpoint saying "deleted" staged, the head saying so in the mirror
// (or never written: nothing of the file was acknowledged). Their checkpoint records are
// staged for removal, to be committed with the checkpoints just staged; forget then
// drops them from memory once that commit succeeded. Without this, every file deleted
// while the daemon runs would keep its state and its record for ever.
func (p *Publisher) forgetGone() []*fileState {
	p.mu.Lock()
	cands := make([]*fileState, 0, len(p.goneFiles))
	for st := range p.goneFiles {
		cands = append(cands, st)
	}
	p.mu.Unlock()
	var done []*fileState
	for _, st := range cands {
		st.mu.Lock()
		settled := st.gone && len(st.queue) == 0 && !st.cpDirty && !st.failed &&
			(st.goneHeadWritten || st.acked.StreamSeq == 0)
		id := st.file.ID
		st.mu.Unlock()
		if !settled {
			continue
		}
		p.mu.Lock()
		current := p.files[id] == st // not reopened meanwhile under the same identity
		p.mu.Unlock()
		if current {
			p.opts.Checkpoints.Delete(checkpoint.Key(id.Dev, id.Ino))
		}
		done = append(done, st)
	}
	return done
}

// forget drops the files forgetGone settled, their records' removal committed.
func (p *Publisher) forget(done []*fileState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range done {
		delete(p.goneFiles, st)
		if p.files[st.file.ID] == st {
			p.forgotten[st.file.Root]++
		}
		p.drop(st)
	}
}

// drop removes st from the indexes that still point at it. The caller holds p.mu.
func (p *Publisher) drop(st *fileState) {
	id := st.file.ID
	if p.files[id] != st {
		return // reopened under the same identity: the new state owns the entries
	}
	delete(p.files, id)
	if p.byPath[st.file.Path] == id {
		delete(p.byPath, st.file.Path)
	}
	if p.byConv[st.conv.Key] == id {
		delete(p.byConv, st.conv.Key)
	}
}
