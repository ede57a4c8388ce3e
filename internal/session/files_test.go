package session

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestFiles reads whole session files the way pisync does (header, then one
// envelope per non-blank line, the leaf rule across them) and checks what
// each Pi format yields.
func TestFiles(t *testing.T) {
	tests := []struct {
		file      string
		id        string
		format    Format
		cwd       string
		entries   int // well-formed entry lines
		leaf      string
		types     []string // of the well-formed entries, in order; nil to skip
		malformed []int    // 1-based line numbers ScanEntry refuses
	}{
		{file: "harness_v3.jsonl", id: "0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b", format: FormatV3, cwd: "/home/ana/proj",
			entries: 11, leaf: "a3", types: []string{"thinking_level_change", "model_change", "active_tools_change",
				"message", "message", "message", "message", "leaf", "branch_summary", "label", "message"}},
		{file: "harness_v3_null_leaf.jsonl", id: "0199a3c2-0000-7000-8000-000000000002", format: FormatV3, cwd: "/srv/app",
			entries: 2, leaf: ""},
		{file: "harness_v3_header_only.jsonl", id: "0199a3c2-0000-7000-8000-000000000003", format: FormatV3, cwd: "/srv/app"},
		{file: "cli_v3.jsonl", id: "5b0e3e4c-2f6d-4b8a-9c1e-7a6b5c4d3e2f", format: FormatV3, cwd: "/Users/bo/code/site",
			entries: 8, leaf: "d0e1f2a3", types: []string{"model_change", "message", "message", "message", "custom",
				"custom_message", "compaction", "session_info"}},
		{file: "cli_v2.jsonl", id: "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f", format: FormatV2, cwd: `C:\Users\bo\proj`,
			entries: 2, leaf: "22222222"},
		{file: "cli_v1.jsonl", id: "3e4f5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7", format: FormatV1, cwd: "/home/old",
			entries: 3, leaf: "", types: []string{"message", "message", "compaction"}},
		{file: "crlf_blank_unknown.jsonl", id: "crlf-0001", format: FormatV3, cwd: "/w",
			entries: 2, leaf: "x2", types: []string{"message", "some_future_type"}},
		{file: "torn_tail.jsonl", id: "0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b", format: FormatV3, cwd: "/home/ana/proj",
			entries: 2, leaf: "m0000001", malformed: []int{4}},
		{file: "glued_fragment.jsonl", id: "0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b", format: FormatV3, cwd: "/home/ana/proj",
			entries: 2, leaf: "m0000001", malformed: []int{4}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "files", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.Split(data, []byte("\n"))
			if len(lines[len(lines)-1]) == 0 {
				lines = lines[:len(lines)-1]
			}
			h, err := ParseHeader(lines[0])
			if err != nil {
				t.Fatalf("header: %v", err)
			}
			if h.ID != tt.id || h.Format != tt.format || h.Cwd != tt.cwd {
				t.Errorf("header = %+v, want id %q format %q cwd %q", h, tt.id, tt.format, tt.cwd)
			}
			var (
				leaf      Leaf
				types     []string
				malformed []int
			)
			for n, line := range lines[1:] {
				if IsBlank(line) {
					continue
				}
				e, err := ScanEntry(line)
				if err != nil {
					if !errors.Is(err, ErrMalformed) {
						t.Errorf("line %d: error %v does not wrap ErrMalformed", n+2, err)
					}
					malformed = append(malformed, n+2)
					continue
				}
				leaf.Apply(e)
				types = append(types, e.Type)
			}
			if len(types) != tt.entries {
				t.Errorf("%d entries, want %d", len(types), tt.entries)
			}
			if tt.types != nil && !slices.Equal(types, tt.types) {
				t.Errorf("types = %q, want %q", types, tt.types)
			}
			if leaf.ID() != tt.leaf {
				t.Errorf("leaf = %q, want %q", leaf.ID(), tt.leaf)
			}
			if !slices.Equal(malformed, tt.malformed) {
				t.Errorf("malformed lines = %v, want %v", malformed, tt.malformed)
			}
		})
	}
}
