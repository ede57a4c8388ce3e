package publisher

import (
	"path/filepath"
	"testing"

	"go.uber.org/zap"

	"github.com/pisync/pisync/watcher"
)

// TestClaimOfAReusedInodeBeingOpened (torture T28, seed 453369031700): a session file was
// replaced by a rewrite (op 82) and, 2 ms later, a copy of another session was written
// (op 83) under the inode number the replaced file had just freed. The copy's Open was
// under way when the rewrite's Open claimed its conversation key, still recorded under
// that inode number: an Open in progress kept any key claimed under its identity, so
// the rewrite took a clash key while the head of the plain key still named its path
// (two heads for one file). An Open in progress keeps only the key it claimed itself.
func TestClaimOfAReusedInodeBeingOpened(t *testing.T) {
	_, p, _ := publisherOnServer(t)
	root := t.TempDir()
	const id = "a5215a96-26ae-482e-9338-72aa38ef87c1"
	file := func(ino uint64, name string) watcher.File {
		return watcher.File{ID: watcher.FileID{Dev: 1, Ino: ino}, Root: root, Rel: name, Path: filepath.Join(root, name)}
	}
	log := zap.NewNop()

	replaced := file(7, "replaced.jsonl") // its state retired, its claim left behind
	if got := p.claimKey(replaced, id, id, log); got != id {
		t.Fatalf("first claim: %q", got)
	}
	copyOfOther := file(7, "copy-of-another-session.jsonl") // inode 7 again, another session
	p.beginOpen(copyOfOther)
	rewrite := file(8, "replaced.jsonl")
	if got := p.claimKey(rewrite, id, id, log); got != id {
		t.Errorf("the rewrite took %q, want the plain key %q: an Open of another session under the claim's old inode number held it", got, id)
	}
	p.endOpen(copyOfOther)

	// An Open in progress keeps the key it claimed itself.
	const other = "0b6c6e0e-2c4b-4c8e-9a51-8f0d5a2e7c11"
	opening := file(9, "opening.jsonl")
	p.beginOpen(opening)
	if got := p.claimKey(opening, other, other, log); got != other {
		t.Fatalf("claim by an Open in progress: %q", got)
	}
	second := file(10, "second.jsonl")
	if got := p.claimKey(second, other, other, log); got == other {
		t.Errorf("a second file took %q from the Open in progress that claimed it", got)
	}
	p.endOpen(opening)
}
