// Package sysmem drops from a process's memory the file pages it holds mapped, and
// measures them. A daemon's resident memory counts every page of a file it has mapped and touched
// (its own code, a bbolt database) although they are clean copies of the files: after a
// burst of work they are most of what it holds beyond its heap.
package sysmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Unmap drops the pages of [addr, addr+n), a shared mapping of a file, from this
// process's memory (MADV_DONTNEED); they stay in the page cache, and a later access maps
// them again. Only for shared file mappings: a private one would lose its written pages.
func Unmap(addr, n uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_DONTNEED); e != 0 {
		return fmt.Errorf("madvise %x+%d: %w", addr, n, e)
	}
	return nil
}

// ReleaseProgram drops the resident pages of the program's code and read-only data from
// this process's memory (MADV_DONTNEED); they stay in the page cache, and what runs again
// is mapped back on its first use. Only mappings of the executable without write
// permission and without a page of their own (Anonymous: 0 in smaps) qualify: their
// pages are clean copies of the file. A page the process changed (relocations of a
// dynamically linked build, a debugger's breakpoint) would be lost, so a mapping holding
// one is left alone. (MADV_PAGEOUT would be safe there too, but the kernel applies it to
// a file only for a process that could write the file, which a daemon installed by root
// cannot.)
func ReleaseProgram() error {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("find the executable: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return fmt.Errorf("read the mappings: %w", err)
	}
	var start, end uintptr
	var ok bool
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Bytes()
		if isMappingLine(line) {
			start, end, ok = programMapping(line, exe)
			continue
		}
		f := bytes.Fields(line)
		if !ok || len(f) < 2 || string(f[0]) != "Anonymous:" {
			continue
		}
		ok = false
		if string(f[1]) != "0" {
			continue // pages of its own: not copies of the file
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_DONTNEED); e != 0 {
			return fmt.Errorf("madvise %x-%x: %w", start, end, e)
		}
	}
	return sc.Err()
}

// isMappingLine reports whether a line of /proc/self/smaps starts a mapping ("start-end
// perms offset dev inode [path]") rather than giving one of its fields ("Name: value").
func isMappingLine(line []byte) bool {
	f := bytes.Fields(line)
	return len(f) >= 5 && bytes.IndexByte(f[0], '-') > 0 && !bytes.HasSuffix(f[0], []byte(":"))
}

// programMapping parses one line of /proc/self/maps ("start-end perms offset dev inode
// path") and returns its range when it maps exe without write permission.
func programMapping(line []byte, exe string) (start, end uintptr, ok bool) {
	f := bytes.Fields(line)
	if len(f) != 6 || string(f[5]) != exe || len(f[1]) < 2 || f[1][1] == 'w' {
		return 0, 0, false
	}
	lo, hi, found := bytes.Cut(f[0], []byte("-"))
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(string(lo), 16, 64)
	e, err2 := strconv.ParseUint(string(hi), 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}

// Resident is how many bytes of this process's mappings of path are resident
// (/proc/self/smaps).
func Resident(path string) (int64, error) {
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	var rss int64
	in := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		switch {
		case isMappingLine(sc.Bytes()):
			in = len(f) == 6 && string(f[5]) == path
		case in && len(f) == 3 && string(f[0]) == "Rss:":
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("smaps: %q: %w", sc.Text(), err)
			}
			rss += kb << 10
		}
	}
	return rss, sc.Err()
}
