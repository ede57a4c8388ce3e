package verify

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
)

// maxHeaderLine bounds how much of a file is read to find its header line.
const maxHeaderLine = 1 << 20

// LocalFile is a Pi session file found under a watched root.
type LocalFile struct {
	Root     string // absolute, clean
	Rel      string // relative to Root, slash-separated (as the daemon records it)
	Path     string
	Header   session.Header
	HeaderOK bool  // the first line is complete and a session header
	Size     int64 // bytes
	Torn     int64 // bytes after the last newline (a line still being written, or left by a crash)
	ModTime  time.Time
	Err      error // the file could not be read
}

// FindSessions lists the Pi session files under roots (recursively, *.jsonl, symbolic
// links not followed), sorted by path. A .jsonl whose complete first line is not a
// session header is not one and is left out, as the daemon skips it; a file whose first
// line is not complete yet is kept, with HeaderOK false. A root that does not exist has
// no files.
func FindSessions(roots []string) ([]LocalFile, error) {
	var out []LocalFile
	for _, r := range roots {
		root, err := filepath.Abs(r)
		if err != nil {
			return nil, fmt.Errorf("root %s: %w", r, err)
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root && errors.Is(err, fs.ErrNotExist) {
					return filepath.SkipDir
				}
				out = append(out, LocalFile{Root: root, Rel: relSlash(root, p), Path: p, Err: err})
				if d != nil && d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !d.Type().IsRegular() || !strings.HasSuffix(p, ".jsonl") {
				return nil
			}
			f := LocalFile{Root: root, Rel: relSlash(root, p), Path: p}
			if keep := readLocal(&f); keep {
				out = append(out, f)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", root, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func relSlash(root, p string) string {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return filepath.ToSlash(p)
	}
	return filepath.ToSlash(rel)
}

// readLocal fills f from the file: size, torn tail and header. It reports whether the
// file is (or may become) a session.
func readLocal(f *LocalFile) bool {
	fh, err := os.Open(f.Path)
	if err != nil {
		f.Err = err
		return true
	}
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		f.Err = err
		return true
	}
	f.Size, f.ModTime = info.Size(), info.ModTime()
	if f.Size == 0 {
		return false // nothing written yet: nothing to mirror
	}
	line, err := bufio.NewReaderSize(io.LimitReader(fh, maxHeaderLine), 4096).ReadBytes('\n')
	switch {
	case err == nil:
		h, perr := session.ParseHeader(bytes.TrimSuffix(line, []byte("\n")))
		if perr != nil {
			return false
		}
		f.Header, f.HeaderOK = h, true
	case errors.Is(err, io.EOF):
		// The first line is not complete (or too long to be a header we can read).
	default:
		f.Err = err
		return true
	}
	if f.Torn, err = tornTail(fh, f.Size); err != nil {
		f.Err = err
	}
	return true
}

// tornTail returns how many bytes follow the last newline of a file of size bytes,
// reading backwards in chunks.
func tornTail(r io.ReaderAt, size int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for end := size; end > 0; {
		start := max(end-int64(len(buf)), 0)
		chunk := buf[:end-start]
		if _, err := r.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
			return size - (start + int64(i) + 1), nil
		}
		end = start
	}
	return size, nil
}

// HeadLister lists the heads of the caller's conversations; *mirror.Reader implements it.
type HeadLister interface {
	Heads(ctx context.Context) ([]mirror.Head, error)
}

// Pair is a local session file and the head the mirror has for it. File is nil for a
// head of this host, under one of the roots, whose file is gone; Head is nil for a file
// the mirror does not know.
type Pair struct {
	File *LocalFile
	Head *mirror.Head
}

// Survey finds the session files under roots and pairs each with its head: the head of
// this host recorded at the same root and path, else the head of the conversation id in
// the file's header. Heads of this host under these roots that no file claims come back
// with a nil File. It also returns every head of the owner.
func Survey(ctx context.Context, m HeadLister, roots []string, host string) ([]Pair, []mirror.Head, error) {
	files, err := FindSessions(roots)
	if err != nil {
		return nil, nil, err
	}
	heads, err := m.Heads(ctx)
	if err != nil {
		return nil, nil, err
	}
	type loc struct{ host, root, source string }
	byLoc := map[loc]int{}
	byKey := map[string]int{}
	for i, h := range heads {
		byLoc[loc{h.Host, filepath.Clean(h.Root), h.Source}] = i
		byKey[h.ConvKey()] = i
	}
	used := make([]bool, len(heads))
	pairs := make([]Pair, 0, len(files))
	for i := range files {
		f := &files[i]
		p := Pair{File: f}
		if j, ok := byLoc[loc{host, f.Root, f.Rel}]; ok {
			p.Head, used[j] = &heads[j], true
		}
		pairs = append(pairs, p)
	}
	// Second pass by id, for files the daemon recorded elsewhere (moved, another host).
	for i := range pairs {
		p := &pairs[i]
		if p.Head != nil || !p.File.HeaderOK {
			continue
		}
		if j, ok := byKey[p.File.Header.ID]; ok && !used[j] {
			p.Head, used[j] = &heads[j], true
		}
	}
	rootSet := map[string]bool{}
	for _, r := range roots {
		if abs, err := filepath.Abs(r); err == nil {
			rootSet[abs] = true
		}
	}
	for j := range heads {
		if !used[j] && heads[j].Host == host && rootSet[filepath.Clean(heads[j].Root)] {
			pairs = append(pairs, Pair{Head: &heads[j]})
		}
	}
	return pairs, heads, nil
}
