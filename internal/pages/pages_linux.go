// Package pages hands file pages a process holds mapped back to the kernel, and measures
// them. A daemon's resident memory counts every page of a file it has mapped and touched
// (its own code, a bbolt database) although they are clean copies of the files: after a
// burst of work they are most of what it holds beyond its heap.
package pages

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

// ReleaseProgram asks the kernel to reclaim the resident pages of the program's code
// and read-only data (MADV_PAGEOUT, Linux 5.4 and later; on older kernels it does
// nothing). They are clean copies of the executable: what runs again is read back on
// its first use. Writable mappings are left alone.
func ReleaseProgram() error {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("find the executable: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("read the mappings: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := programMapping(sc.Bytes(), exe)
		if !ok {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT); e != 0 {
			if e == unix.EINVAL {
				return nil // a kernel without MADV_PAGEOUT
			}
			return fmt.Errorf("madvise %x-%x: %w", start, end, e)
		}
	}
	return sc.Err()
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
		case len(f) >= 5 && bytes.IndexByte(f[0], '-') > 0 && !bytes.HasSuffix(f[0], []byte(":")):
			in = len(f) == 6 && string(f[5]) == path // a mapping's first line
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
