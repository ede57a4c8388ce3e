package session

// Leaf applies Pi's leaf rule while scanning entries in file order: an
// ordinary entry with an id makes the leaf its own id; a "leaf" entry makes it
// its TargetID (possibly "", i.e. null). Entries without an id (v1) leave it
// unchanged. The rule is why file order carries meaning: the same entries in
// another order can open on another branch.
//
// The zero value is the leaf of a file with no entries.
type Leaf struct {
	id string
}

// Apply advances the leaf past entry e.
func (l *Leaf) Apply(e Envelope) {
	switch {
	case e.Type == "leaf":
		l.id = e.TargetID
	case e.ID != "":
		l.id = e.ID
	}
}

// ID returns the current leaf id, "" when there is none or it was moved to
// null (before the first entry).
func (l *Leaf) ID() string { return l.id }

// Set restores the leaf from a checkpoint, so that tailing can resume in the
// middle of a file without rescanning it.
func (l *Leaf) Set(id string) { l.id = id }
