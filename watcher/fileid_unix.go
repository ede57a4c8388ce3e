//go:build unix

package watcher

import (
	"os"
	"syscall"
)

// openFlags open a session file for reading; O_NONBLOCK keeps a FIFO that replaced the
// file between stat and open from blocking the worker, and O_NOFOLLOW refuses a symbolic
// link swapped in there (which could point out of the root).
const openFlags = os.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOFOLLOW

// fileIDOf returns the device and inode of fi.
func FileIDOf(fi os.FileInfo) FileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileID{}
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)} //nolint:unconvert // Dev is int32 on darwin
}
