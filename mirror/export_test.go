package mirror

// SetMaxRevisions lowers the bound on remembered head revisions, for tests.
func (w *Writer) SetMaxRevisions(n int) { w.maxRevs = n }

// Revisions is how many head revisions w remembers.
func (w *Writer) Revisions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.revs)
}
