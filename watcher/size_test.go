package watcher

import (
	"testing"
	"unsafe"
)

// TestFileStateSize: there is one fileState per session file, idle or not (100,000 on a
// big host), allocated in the allocator's 480-byte size class; a field, or padding, that
// takes it past 480 bytes costs 32 bytes more a file (the next class, 512).
func TestFileStateSize(t *testing.T) {
	got := unsafe.Sizeof(fileState{})
	t.Logf("fileState: %d bytes", got)
	if unsafe.Sizeof(uintptr(0)) == 8 && got > 480 {
		t.Errorf("fileState is %d bytes, want at most 480", got)
	}
}
