package publisher

import "time"

// OldestUnackedByRoot reports, per root, when the oldest line still waiting for its
// acknowledgement was read: the lag of that root's mirror behind its files. Roots with
// nothing waiting are left out.
func (p *Publisher) OldestUnackedByRoot() map[string]time.Time {
	out := map[string]time.Time{}
	for _, st := range p.snapshotFiles() {
		st.mu.Lock()
		if !st.skipped && !st.gone {
			if o := st.oldestSeen(); !o.IsZero() {
				if cur, ok := out[st.file.Root]; !ok || o.Before(cur) {
					out[st.file.Root] = o
				}
			}
		}
		st.mu.Unlock()
	}
	return out
}
