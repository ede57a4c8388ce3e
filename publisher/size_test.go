package publisher

import (
	"testing"
	"unsafe"
)

// TestFileStateSize: there is one fileState per session file, idle or not (100,000 on a
// big host), allocated in the allocator's 512-byte size class; a field, or padding, that
// takes it past 512 bytes costs 64 bytes more a file (the next class, 576).
func TestFileStateSize(t *testing.T) {
	got := unsafe.Sizeof(fileState{})
	t.Logf("fileState: %d bytes", got)
	if unsafe.Sizeof(uintptr(0)) == 8 && got > 512 {
		t.Errorf("fileState is %d bytes, want at most 512", got)
	}
}
