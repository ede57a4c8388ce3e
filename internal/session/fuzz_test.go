package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// addFixtureLines seeds a fuzz target with every line of testdata/files, on
// top of the corpus in testdata/fuzz.
func addFixtureLines(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "files", "*.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			f.Add(line)
		}
	}
}

// FuzzScanEntry checks ScanEntry against encoding/json: the same lines are
// valid, and the same top-level fields come out. The reference decodes into
// a map, not a struct, because struct fields match keys case-insensitively
// while JSON.parse (and ScanEntry) match them exactly.
func FuzzScanEntry(f *testing.F) {
	addFixtureLines(f)
	f.Fuzz(func(t *testing.T, line []byte) {
		got, err := ScanEntry(line)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}

		var m map[string]json.RawMessage
		if rerr := json.Unmarshal(line, &m); rerr != nil {
			if strings.Contains(rerr.Error(), "exceeded max depth") {
				return // encoding/json stops at 10000 levels; JSON.parse and ScanEntry do not
			}
			if json.Valid(line) {
				// A valid non-object: an array, a string, a number, true or false.
				if err == nil {
					t.Fatalf("ScanEntry accepted a non-object %q: %+v", line, got)
				}
				return
			}
			if err == nil {
				t.Fatalf("ScanEntry accepted invalid JSON %q: %+v (encoding/json: %v)", line, got, rerr)
			}
			return
		}
		if m == nil { // the line is null
			if err == nil {
				t.Fatalf("ScanEntry accepted %q", line)
			}
			return
		}

		want, wantOK := reference(m)
		if !wantOK {
			if err == nil {
				t.Fatalf("ScanEntry(%q) = %+q, want an error", line, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("ScanEntry(%q): %v; want %+q", line, err, want)
		}
		if got != want {
			t.Fatalf("ScanEntry(%q)\n got %+q\nwant %+q", line, got, want)
		}
	})
}

// reference applies ScanEntry's rules to a decoded top level.
func reference(m map[string]json.RawMessage) (Envelope, bool) {
	kind := func(k string) (string, int) {
		raw, ok := m[k]
		switch {
		case !ok:
			return "", kindAbsent
		case string(raw) == "null":
			return "", kindNull
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				panic(err)
			}
			return s, kindString
		}
		return "", kindOther
	}
	var e Envelope
	var k int
	if e.Type, k = kind("type"); k != kindString {
		return Envelope{}, false
	}
	if e.ID, k = kind("id"); k != kindString && k != kindAbsent {
		return Envelope{}, false
	}
	if e.ParentID, k = kind("parentId"); k == kindOther {
		return Envelope{}, false
	}
	if e.TargetID, k = kind("targetId"); k == kindOther {
		return Envelope{}, false
	}
	e.Timestamp, _ = kind("timestamp")
	return e, true
}

// FuzzParseHeader checks that ParseHeader never panics, fails only with
// ErrNotSession, never accepts invalid JSON, and agrees with ScanEntry on the
// fields both read.
func FuzzParseHeader(f *testing.F) {
	addFixtureLines(f)
	f.Fuzz(func(t *testing.T, line []byte) {
		h, err := ParseHeader(line)
		if err != nil {
			if !errors.Is(err, ErrNotSession) {
				t.Fatalf("error %v does not wrap ErrNotSession", err)
			}
			if h != (Header{}) {
				t.Fatalf("ParseHeader returned %+v with an error", h)
			}
			return
		}
		if !json.Valid(line) {
			t.Fatalf("ParseHeader accepted invalid JSON %q", line)
		}
		if h.ID == "" {
			t.Fatalf("ParseHeader(%q) accepted an empty id", line)
		}
		if h.Format != formatOf(h.Version) {
			t.Fatalf("format %q for version %d", h.Format, h.Version)
		}
		e, err := ScanEntry(line)
		if err != nil {
			// The only header ScanEntry may refuse is one whose envelope
			// keys a header does not have are of the wrong kind.
			if !strings.Contains(err.Error(), "parentId") && !strings.Contains(err.Error(), "targetId") {
				t.Fatalf("ParseHeader accepted %q, ScanEntry: %v", line, err)
			}
			return
		}
		if e.Type != "session" || e.ID != h.ID || e.Timestamp != h.Timestamp {
			t.Fatalf("ScanEntry(%q) = %+q, ParseHeader = %+v", line, e, h)
		}
	})
}
