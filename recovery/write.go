package recovery

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pisync/pisync/internal/session"
)

// Blobs opens blob payloads by digest; *mirror.Reader implements it.
type Blobs interface {
	Blob(ctx context.Context, sha256hex string) (io.ReadCloser, error)
}

// maxListed bounds how many offending lines a refusal names.
const maxListed = 5

// existing is what a file already at the target holds, compared with the rebuilt one.
type existing struct {
	exists    bool
	identical bool     // byte for byte the rebuilt file (by line digests)
	lacking   []string // lines the mirror does not hold, described (at most maxListed)
	nLacking  int
	inspected // the file, open, and what it was when inspected: the rename checks it again
}

// inspect compares the file at rel (if any) with plan, line by line by digest. heldFn
// returns the digest of every line the mirror has, in any generation, and of the lines
// recovery makes; it is called only when the file exists. A local line outside it would
// be lost by overwriting the file. A torn last line counts as such a line. The file is
// returned open with its state (see inspected), for the rename to check that it is still
// what was inspected; a file that changes while it is read fails with ErrTargetChanged.
func inspect(root *os.Root, rel string, plan *Plan, heldFn func() map[string]bool) (existing, error) {
	f, err := root.Open(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return existing{}, nil
	}
	if err != nil {
		return existing{}, fmt.Errorf("open existing %s: %w", rel, err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	id, before, err := stateOf(f)
	if err != nil {
		return existing{}, fmt.Errorf("read existing %s: %w", rel, err)
	}
	held := heldFn()
	e := existing{exists: true, identical: true}
	var n, read int64
	torn, err := session.ReadLines(io.LimitReader(f, before.size), func(l session.DigestedLine) error {
		n++
		read += l.Size + 1
		if l.Ordinal >= int64(len(plan.Lines)) || plan.Lines[l.Ordinal].SHA256 != l.SHA256 {
			e.identical = false
		}
		if !held[l.SHA256] {
			e.nLacking++
			if len(e.lacking) < maxListed {
				desc := fmt.Sprintf("line %d", l.Ordinal+1)
				if id := l.EntryID(); id != "" {
					desc += " (entry " + id + ")"
				}
				e.lacking = append(e.lacking, desc)
			}
		}
		return nil
	})
	if err != nil {
		return existing{}, fmt.Errorf("read existing %s: %w", rel, err)
	}
	if _, after, err := stateOf(f); err != nil || after != before || read+torn != before.size {
		return existing{}, fmt.Errorf("%w: %s changed while it was read: something writes to it; recover it again once nothing does", ErrTargetChanged, rel)
	}
	if n != int64(len(plan.Lines)) {
		e.identical = false
	}
	if torn > 0 {
		e.identical = false
		e.nLacking++
		e.lacking = append(e.lacking, fmt.Sprintf("a torn last line of %d bytes", torn))
	}
	e.inspected = inspected{f: f, id: id, want: before}
	keep = true
	return e, nil
}

func (e existing) lackingText() string {
	s := strings.Join(e.lacking, ", ")
	if more := e.nLacking - len(e.lacking); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// render writes the rebuilt file to w: each line and its newline, blobs streamed from the
// mirror through a digest, so that memory does not grow with blob size. A blob whose
// bytes do not match their digest or size fails with ErrDigest.
func render(ctx context.Context, w io.Writer, blobs Blobs, plan *Plan) error {
	nl := []byte{'\n'}
	for _, l := range plan.Lines {
		if l.Data != nil {
			if _, err := w.Write(l.Data); err != nil {
				return err
			}
		} else if err := streamBlob(ctx, w, blobs, l); err != nil {
			return err
		}
		if _, err := w.Write(nl); err != nil {
			return err
		}
	}
	return nil
}

func streamBlob(ctx context.Context, w io.Writer, blobs Blobs, l OutLine) error {
	rc, err := blobs.Blob(ctx, l.SHA256)
	if err != nil {
		return fmt.Errorf("line %d: %w", l.Ordinal+1, err)
	}
	defer rc.Close()
	h := sha256.New()
	// One byte more than recorded, so that a longer object is noticed.
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(rc, l.Size+1))
	if err != nil {
		return fmt.Errorf("line %d: blob %s: %w", l.Ordinal+1, l.SHA256, err)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	if err := checkBlob(l.SHA256, l.Size, n, sum); err != nil {
		return fmt.Errorf("line %d: %w", l.Ordinal+1, err)
	}
	return nil
}

// writeAtomic writes plan to t: a temporary file in the target directory (mode 0600),
// fsync, rename over the target, fsync of the directory. New directories get mode 0700.
// Every path goes through os.Root, so nothing lands outside t.root even through a
// symbolic link. On failure the temporary file is removed and the target is untouched.
func writeAtomic(ctx context.Context, blobs Blobs, t target, plan *Plan) error {
	s, err := stage(ctx, blobs, t, plan)
	if err != nil {
		return err
	}
	return s.commit()
}

// staged is a rebuilt file written under a temporary name in its target directory, not
// yet durable nor in place: commitBatch finishes it, with others.
type staged struct {
	made *madeDirs
	f    *os.File // the temporary file, then the rebuilt file in place; nil once closed
	tmp  string   // relative to made.root
	t    target
	// old is the file at the target when it was inspected, held open until the commit
	// is settled (see replace); zero when there was none.
	old     inspected
	bak     string    // a second name of old while it is replaced, relative to made.root
	rebuilt fileState // of f, once durable
}

// stage writes plan to a temporary file in the target directory. On failure nothing is
// left behind, directories included.
func stage(ctx context.Context, blobs Blobs, t target, plan *Plan) (*staged, error) {
	made, err := mkdirs(t)
	if err != nil {
		made.discard()
		return nil, err
	}
	dir := filepath.Dir(t.rel)
	// Not *.jsonl, so that a daemon watching the tree ignores it until the rename. Read
	// and write: the commit checks its tail.
	tmp := sibling(t.rel, ".", ".tmp")
	f, err := made.root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		made.discard()
		return nil, fmt.Errorf("create temporary file in %s: %w", filepath.Join(t.root, dir), err)
	}
	s := &staged{made: made, f: f, tmp: tmp, t: t}
	bw := writers.Get().(*bufio.Writer)
	defer func() {
		bw.Reset(nil)
		writers.Put(bw)
	}()
	bw.Reset(f)
	if err := render(ctx, bw, blobs, plan); err != nil {
		s.abort()
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		s.abort()
		return nil, fmt.Errorf("write %s: %w", t.path(), err)
	}
	return s, nil
}

// writers are the write buffers of stage, reused: 256 KiB allocated and zeroed per file
// showed in the profile of a recovery of many conversations.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 256<<10) }}

// durable fsyncs the temporary file and records its state; on failure it aborts.
func (s *staged) durable() error {
	err := s.f.Sync()
	if err != nil {
		err = fmt.Errorf("fsync %s: %w", s.t.path(), err)
	} else if _, s.rebuilt, err = stateOf(s.f); err != nil {
		err = fmt.Errorf("read back %s: %w", s.t.path(), err)
	}
	if err != nil {
		s.abort()
		return err
	}
	return nil
}

// abort removes the temporary file and the directories made for it, and lets go of the
// file it was to replace: a refused or failed write leaves nothing behind. Only before
// the rename.
func (s *staged) abort() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	if s.made.root != nil {
		_ = s.made.root.Remove(s.tmp)
	}
	s.old.close()
	s.made.discard()
}

// release closes what a committed file still holds open.
func (s *staged) release() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	s.old.close()
	s.made.close()
}

// commit commits s alone.
func (s *staged) commit() error { return commitBatch([]*staged{s})[0] }

// madeDirs are the directories a write created, so that a failed write can remove them.
type madeDirs struct {
	root  *os.Root
	outer []string // absolute, created above and including t.root, deepest first
	inner []string // relative to root, deepest first
}

// mkdirs creates t.root and the target's directory (mode 0700) and opens the root,
// remembering what did not exist before.
func mkdirs(t target) (*madeDirs, error) {
	m := &madeDirs{}
	for d := t.root; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || filepath.Dir(d) == d {
			break
		}
		m.outer = append(m.outer, d)
	}
	if err := os.MkdirAll(t.root, 0o700); err != nil {
		return m, fmt.Errorf("create %s: %w", t.root, err)
	}
	root, err := os.OpenRoot(t.root)
	if err != nil {
		return m, fmt.Errorf("open %s: %w", t.root, err)
	}
	m.root = root
	for d := filepath.Dir(t.rel); d != "."; d = filepath.Dir(d) {
		if _, err := root.Lstat(d); err == nil {
			break
		}
		m.inner = append(m.inner, d)
	}
	if err := root.MkdirAll(filepath.Dir(t.rel), 0o700); err != nil {
		return m, fmt.Errorf("create %s: %w", filepath.Join(t.root, filepath.Dir(t.rel)), err)
	}
	return m, nil
}

// discard removes the directories mkdirs created (they are empty again after a failed
// write; one another write put a file in stays) and closes the root.
func (m *madeDirs) discard() {
	if m.root != nil {
		for _, d := range m.inner {
			_ = m.root.Remove(d)
		}
	}
	for _, d := range m.outer {
		_ = os.Remove(d)
	}
	m.close()
}

func (m *madeDirs) close() {
	if m.root != nil {
		m.root.Close()
		m.root = nil
	}
}

// syncDir makes the rename durable.
func syncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
