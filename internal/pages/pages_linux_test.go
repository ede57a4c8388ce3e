package pages

import (
	"os"
	"testing"
)

func TestProgramMapping(t *testing.T) {
	const exe = "/usr/local/bin/pisync"
	for _, tc := range []struct {
		line       string
		start, end uintptr
		ok         bool
	}{
		{"00400000-01a00000 r-xp 00000000 fd:01 1234 /usr/local/bin/pisync", 0x400000, 0x1a00000, true},
		{"01a00000-02e00000 r--p 01600000 fd:01 1234 /usr/local/bin/pisync", 0x1a00000, 0x2e00000, true},
		{"02e00000-02f00000 rw-p 02a00000 fd:01 1234 /usr/local/bin/pisync", 0, 0, false}, // data
		{"c000000000-c004000000 rw-p 00000000 00:00 0 ", 0, 0, false},                     // the heap
		{"7f0000000000-7f0000100000 r--s 00000000 fd:01 99 /state/checkpoints.db", 0, 0, false},
		{"00400000-01a00000 r-xp 00000000 fd:01 1234 /usr/local/bin/pisync (deleted)", 0, 0, false},
		{"00400000-01a00000 r-xp 00000000 fd:01 1234 /usr/local/bin/pisync-old", 0, 0, false},
		{"01a00000-00400000 r-xp 00000000 fd:01 1234 /usr/local/bin/pisync", 0, 0, false},
		{"zz-01a00000 r-xp 00000000 fd:01 1234 /usr/local/bin/pisync", 0, 0, false},
	} {
		start, end, ok := programMapping([]byte(tc.line), exe)
		if start != tc.start || end != tc.end || ok != tc.ok {
			t.Errorf("programMapping(%q) = %x, %x, %v; want %x, %x, %v", tc.line, start, end, ok, tc.start, tc.end, tc.ok)
		}
	}
}

// TestReleaseProgram: the program's pages leave its resident memory (the test binary
// stands for the daemon), and it runs on.
func TestReleaseProgram(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Skip(err)
	}
	before, err := Resident(exe)
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Fatal("no page of the program resident: Resident does not find its mappings")
	}
	if err := ReleaseProgram(); err != nil {
		t.Fatal(err)
	}
	after, err := Resident(exe)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the program's resident pages: %d KiB before, %d KiB after", before>>10, after>>10)
	if after > before/2 {
		t.Errorf("%d KiB of the program resident after the release, %d KiB before: want less than half", after>>10, before>>10)
	}
}
