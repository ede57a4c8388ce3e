//go:build linux && (amd64 || arm64)

package watcher

import (
	"bytes"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A periodic rescan meets every session file, and nearly all of them are unchanged. Here
// that costs no allocation: the directory is read with getdents into a pooled buffer and
// each session file is stat'ed relative to the directory by the NUL-terminated name
// getdents left in that buffer. (os.ReadDir and DirEntry.Info allocate an entry, a path
// and a FileInfo per file, about 750 bytes; for 10,000 idle files that was nearly all the
// daemon allocated while idle, and it grew the heap between collections.)

// direntBufSize is what getdents fills per call (os.ReadDir uses the same).
const direntBufSize = 8192

type dirScratch struct {
	dirents [direntBufSize]byte
	path    []byte
}

var dirScratchPool = sync.Pool{New: func() any { return &dirScratch{path: make([]byte, 0, 512)} }}

// freshEntry is a session file a scan must hand to touchLocked: new, or changed.
type freshEntry struct {
	name string
	snap statSnap
}

// listDir touches the session files of dir and returns its subdirectories, in name
// order as os.ReadDir would (new files are queued in that order), and how many entries
// it has (for the watch budget).
func (w *Watcher) listDir(r *root, dir string, gen uint64, initial bool) (subdirs []string, entries int, err error) {
	fd, err := openDir(dir)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(fd)
	sc := dirScratchPool.Get().(*dirScratch)
	defer dirScratchPool.Put(sc)
	path := append(sc.path[:0], dir...)
	if !strings.HasSuffix(dir, "/") {
		path = append(path, '/')
	}
	base := len(path)
	defer func() { sc.path = path[:0] }()

	var fresh []freshEntry
	buf := sc.dirents[:]
	for {
		n, err := getdents(fd, buf)
		if err != nil {
			return nil, 0, &os.PathError{Op: "getdents", Path: dir, Err: err}
		}
		if n <= 0 {
			break
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name (NUL-terminated).
			rec := buf[off:n]
			reclen := int(binary.NativeEndian.Uint16(rec[16:18]))
			if reclen < 20 || reclen > len(rec) {
				break // cannot happen with a sane kernel; stop rather than misread
			}
			rec = rec[:reclen]
			off += reclen
			ino := binary.NativeEndian.Uint64(rec[0:8])
			typ := rec[18]
			name := rec[19:]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if ino == 0 || len(name) == 0 || string(name) == "." || string(name) == ".." {
				continue
			}
			entries++
			path = append(path[:base], name...)
			var st unix.Stat_t
			if typ == unix.DT_UNKNOWN {
				// Some file systems do not say: ask, as os.ReadDir does.
				if fstatat(fd, &rec[19], &st) != nil {
					continue
				}
				typ = dtOf(st.Mode)
			}
			switch {
			case typ == unix.DT_DIR:
				subdirs = append(subdirs, string(path))
			case typ == unix.DT_REG && isSessionName(unsafe.String(&name[0], len(name))):
				if st.Ino == 0 && fstatat(fd, &rec[19], &st) != nil {
					continue
				}
				snap := statSnap{ok: true, id: FileID{Dev: st.Dev, Ino: st.Ino}, size: st.Size,
					mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec}
				w.mu.Lock()
				s := w.files[string(path)]
				skip := s != nil && w.skipUnchangedLocked(s, &snap, gen, initial)
				w.mu.Unlock()
				if !skip {
					fresh = append(fresh, freshEntry{name: string(path), snap: snap})
				}
			}
		}
	}
	slices.Sort(subdirs)
	slices.SortFunc(fresh, func(a, b freshEntry) int { return strings.Compare(a.name, b.name) })
	for i := range fresh {
		w.mu.Lock()
		w.touchLocked(r, fresh[i].name, &fresh[i].snap, gen, initial)
		w.mu.Unlock()
	}
	return subdirs, entries, nil
}

func openDir(dir string) (int, error) {
	for {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: dir, Err: err}
		}
		return fd, nil
	}
}

func getdents(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Getdents(fd, buf)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// fstatat lstats the entry named by the NUL-terminated name relative to dirfd, without
// copying the name (unix.Fstatat would allocate a C string for it).
func fstatat(dirfd int, name *byte, st *unix.Stat_t) error {
	for {
		_, _, e := unix.Syscall6(unix.SYS_NEWFSTATAT, uintptr(dirfd), uintptr(unsafe.Pointer(name)),
			uintptr(unsafe.Pointer(st)), unix.AT_SYMLINK_NOFOLLOW, 0, 0)
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return syscall.Errno(e)
	}
}

func dtOf(mode uint32) uint8 {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return unix.DT_DIR
	case unix.S_IFREG:
		return unix.DT_REG
	}
	return unix.DT_UNKNOWN
}
