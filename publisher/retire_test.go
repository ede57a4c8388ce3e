package publisher

import (
	"path/filepath"
	"testing"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestRetireReplacedLeavesAReusedInodeAlone (torture T32, seed 306040121875): a session
// file was replaced by an atomic rename, and its Open waited for the old file's lines in
// flight before retiring the old state. Meanwhile a new session was written elsewhere
// under the inode number the rename had freed, and its Open registered it under that
// number. The retirement then deleted whatever was registered under the old number: the
// new session's state, whose lines were all sent by then. Its head was never written
// (no state of the file was current any more, and no further line came to reopen it),
// and its checkpoint record was deleted. Retiring removes only the state it retires.
func TestRetireReplacedLeavesAReusedInodeAlone(t *testing.T) {
	ctx, p, store := publisherOnServer(t)
	root := t.TempDir()
	file := func(ino uint64, name string) watcher.File {
		return watcher.File{ID: watcher.FileID{Dev: 1, Ino: ino}, Root: root, Rel: name, Path: filepath.Join(root, name)}
	}
	conv := func(key string) mirror.Conv {
		c, err := mirror.NewConv(p.opts.Owner, key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const replacedID, newID = "e7cfafb6-d234-4f1a-8cc1-f701883b2dbc", "d053d6c5-adb7-4914-9864-6c717bb3285d"

	old := &fileState{file: file(7, "replaced.jsonl"), conv: conv(replacedID), id: replacedID}
	p.mu.Lock()
	p.files[old.file.ID], p.byPath[old.file.Path], p.byConv[replacedID] = old, old.file.ID, old.file.ID
	p.mu.Unlock()

	replacement := file(8, "replaced.jsonl")
	found := p.replacedAt(replacement)
	if found != old {
		t.Fatalf("replaced state %p, want %p", found, old)
	}

	// While the retirement waits for the old file's lines in flight, the new session's
	// Open registers it under inode 7 (as Open does: the old state dropped).
	reusing := &fileState{file: file(7, "elsewhere/new.jsonl"), conv: conv(newID), id: newID}
	p.mu.Lock()
	p.drop(old)
	p.files[reusing.file.ID], p.byPath[reusing.file.Path], p.byConv[newID] = reusing, reusing.file.ID, reusing.file.ID
	p.mu.Unlock()
	rec := checkpoint.Record{Dev: 1, Ino: 7, Root: root, Rel: "elsewhere/new.jsonl", ConvKey: newID, StreamSeq: 4}
	store.Put(rec)

	if key, _, err := p.retire(ctx, found, replacement, replacedID); err != nil || key != replacedID {
		t.Fatalf("retire = %q, %v; want the replaced file's key %q", key, err, replacedID)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.files[reusing.file.ID] != reusing {
		t.Error("the new session's state is no longer registered under its inode number: its head is never written")
	}
	if p.byConv[newID] != reusing.file.ID {
		t.Errorf("the new session's key is held by %v", p.byConv[newID])
	}
	if _, ok := store.Get(rec.Key()); !ok {
		t.Error("the new session's checkpoint record was deleted")
	}
}
