package session

import (
	"errors"
	"testing"
)

func TestParseHeader(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Header
	}{
		{
			name: "v3 harness with metadata",
			line: `{"type":"session","version":3,"id":"abc","timestamp":"2026-01-05T10:00:00.000Z","cwd":"/p","metadata":{"id":"x","type":"y"}}`,
			want: Header{ID: "abc", Version: 3, Timestamp: "2026-01-05T10:00:00.000Z", Cwd: "/p", Format: FormatV3},
		},
		{
			name: "v3 forked",
			line: `{"type":"session","version":3,"id":"abc","timestamp":"t","cwd":"/p","parentSession":"/s/--p--/t_old.jsonl"}`,
			want: Header{ID: "abc", Version: 3, Timestamp: "t", Cwd: "/p", ParentSession: "/s/--p--/t_old.jsonl", Format: FormatV3},
		},
		{
			name: "v2",
			line: `{"type":"session","version":2,"id":"abc","timestamp":"t","cwd":"C:\\w"}`,
			want: Header{ID: "abc", Version: 2, Timestamp: "t", Cwd: `C:\w`, Format: FormatV2},
		},
		{
			name: "v1 without version",
			line: `{"type":"session","id":"abc","timestamp":"t","cwd":"/p"}`,
			want: Header{ID: "abc", Timestamp: "t", Cwd: "/p", Format: FormatV1},
		},
		{
			name: "explicit version 1",
			line: `{"type":"session","version":1,"id":"abc"}`,
			want: Header{ID: "abc", Version: 1, Format: FormatV1},
		},
		{
			name: "null version is v1 (version ?? 1)",
			line: `{"type":"session","version":null,"id":"abc"}`,
			want: Header{ID: "abc", Format: FormatV1},
		},
		{
			name: "version 3.0 is 3 to JSON.parse",
			line: `{"type":"session","version":3.0,"id":"abc"}`,
			want: Header{ID: "abc", Version: 3, Format: FormatV3},
		},
		{
			name: "future version",
			line: `{"type":"session","version":7,"id":"abc"}`,
			want: Header{ID: "abc", Version: 7, Format: "v7"},
		},
		{
			name: "CRLF",
			line: "{\"type\":\"session\",\"version\":3,\"id\":\"abc\",\"cwd\":\"/p\"}\r",
			want: Header{ID: "abc", Version: 3, Cwd: "/p", Format: FormatV3},
		},
		{
			name: "whitespace and escapes",
			line: " { \"type\" : \"sess\\u0069on\", \"id\" : \"a\\/b\" } \r\n",
			want: Header{ID: "a/b", Format: FormatV1},
		},
		{
			name: "non-string optional fields are ignored",
			line: `{"type":"session","id":"abc","timestamp":5,"cwd":null,"parentSession":{}}`,
			want: Header{ID: "abc", Format: FormatV1},
		},
		{
			name: "duplicate key: the last wins as in JSON.parse",
			line: `{"type":"session","id":"first","id":"second"}`,
			want: Header{ID: "second", Format: FormatV1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHeader([]byte(tt.line))
			if err != nil {
				t.Fatalf("ParseHeader(%q): %v", tt.line, err)
			}
			if got != tt.want {
				t.Errorf("ParseHeader(%q)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestParseHeaderRejects(t *testing.T) {
	tests := []struct{ name, line string }{
		{"empty", ``},
		{"blank", "  \r"},
		{"garbage", `garbage`},
		{"array", `[{"type":"session","id":"abc"}]`},
		{"string", `"session"`},
		{"null", `null`},
		{"torn", `{"type":"session","version":3,"id":"ab`},
		{"two objects", `{"type":"session","id":"a"}{"type":"session","id":"b"}`},
		{"entry line", `{"type":"message","id":"abc","parentId":null}`},
		{"type missing", `{"id":"abc"}`},
		{"type not a string", `{"type":1,"id":"abc"}`},
		{"type case differs", `{"Type":"session","id":"abc"}`},
		{"id missing", `{"type":"session","version":3}`},
		{"id empty", `{"type":"session","id":""}`},
		{"id number", `{"type":"session","id":42}`},
		{"id null", `{"type":"session","id":null}`},
		{"id case differs", `{"type":"session","ID":"abc"}`},
		{"version string", `{"type":"session","version":"3","id":"abc"}`},
		{"version fraction", `{"type":"session","version":2.5,"id":"abc"}`},
		{"version huge", `{"type":"session","version":1e300,"id":"abc"}`},
		{"upstream v4 header", `{"kind":"header","version":4,"id":"abc","createdAt":1767607200000,"cwd":"/p"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ParseHeader([]byte(tt.line))
			if !errors.Is(err, ErrNotSession) {
				t.Fatalf("ParseHeader(%q) = %+v, %v; want ErrNotSession", tt.line, h, err)
			}
		})
	}
}
