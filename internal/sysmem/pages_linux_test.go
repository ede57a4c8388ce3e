package sysmem

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"regexp"
	"testing"
	"text/template"
)

// warm runs code that the rest of the test does not: its pages are resident, and
// unused again, as much of a daemon's code is after a back-fill.
func warm(t *testing.T) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tmpl := template.Must(template.New("t").Parse(`{{range .}}{{.Name}}={{printf "%q" .Value}} {{end}}`))
	v := []struct{ Name, Value string }{{"a", "1"}, {"b", "2"}}
	if err := tmpl.Execute(zw, v); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	b, err := json.Marshal(map[string]any{"v": v, "re": regexp.MustCompile(`^(a|b)+[0-9]{2,}$`).String(), "z": buf.Len()})
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
}

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
// stands for the daemon), and it runs on. (Fails with the madvise left out.)
func TestReleaseProgram(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Skip(err)
	}
	warm(t)
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
	// The code that runs between the release and the measure comes back at once, with
	// its neighbours (1.3 to 2.6 MB of this test binary of 4.6); what warm ran does not.
	if after > before*3/4 {
		t.Errorf("%d KiB of the program resident after the release, %d KiB before: want a quarter less at least", after>>10, before>>10)
	}
}
