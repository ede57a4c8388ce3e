package store_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pisync/pisync/store"
)

// TestLinesAsJSONStringifyWritesThem: the store takes only lines JSON.stringify writes for
// one object: no white space between tokens or around the line, no raw control character,
// UTF-8. Recovered, a line that is not would be more than one line of the file, or not one
// Pi reads.
func TestLinesAsJSONStringifyWritesThem(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	good := entryLine("b2c3d4e5", "a1b2c3d4", "tab\tand newline\n escaped")
	evil := `{"type":"message","id":"e0000000","parentId":"a1b2c3d4","timestamp":"2026-12-01T18:00:01.000Z","message":{"role":"user","content":[]}}`
	smuggler := `{"type":"custom","id":"c0000000","parentId":"a1b2c3d4","timestamp":"2026-12-01T18:00:01.000Z","customType":"x","data":[` +
		"\n" + evil + "\n" + `]}`
	entries := []struct {
		name, line string
	}{
		{"newline between tokens", strings.Replace(good, `,"parentId"`, ",\n"+`"parentId"`, 1)},
		{"a whole entry between newlines", smuggler},
		{"carriage return at the end", good + "\r"},
		{"newline at the end", good + "\n"},
		{"space at the start", " " + good},
		{"space between tokens", strings.Replace(good, `"type":`, `"type": `, 1)},
		{"tab between tokens", strings.Replace(good, `,"id"`, ",\t"+`"id"`, 1)},
	}
	for i, c := range entries {
		// Each under an id of its own: one accepted must not hide the next as a conflict.
		c.line = strings.Replace(c.line, `"id":"b2c3d4e5"`, fmt.Sprintf(`"id":"b%07d"`, i), 1)
		t.Run("append/"+c.name, func(t *testing.T) {
			if r := e.req("alice", "append", appendReq("conv1", "a1b2c3d4", c.line)); r.code() != "invalid" {
				t.Fatalf("append %q: %s, want invalid", c.line, r.code())
			}
		})
	}
	if n := len(e.streamMsgs("alice", "conv1")); n != 2 {
		t.Fatalf("refused lines left messages: %d, want 2", n)
	}
	e.mustAppend("alice", "conv1", "a1b2c3d4", good)

	hdr := headerLine("conv2", "/srv/app")
	headers := []struct {
		name, line string
	}{
		{"newline between tokens", strings.Replace(hdr, `,"cwd"`, ",\n"+`"cwd"`, 1)},
		{"carriage return at the end", hdr + "\r"},
		{"space at the start", " " + hdr},
		{"id that climbs out", headerLine("../../../../tmp/pwnX", "/srv/app")},
		{"id with a slash", headerLine("a/b", "/srv/app")},
		{"id with a backslash", headerLine(`a\b`, "/srv/app")},
		{"id with dot dot", headerLine("a..b", "/srv/app")},
		{"id with a control character", headerLine("a\x01b", "/srv/app")},
		{"timestamp that climbs out", strings.Replace(hdr, "2026-12-01T18:00:00.000Z", "../../..", 1)},
		{"timestamp with a slash", strings.Replace(hdr, "2026-12-01T18:00:00.000Z", "2026/12/01", 1)},
	}
	for _, c := range headers {
		t.Run("create/"+c.name, func(t *testing.T) {
			if r := e.req("alice", "create", map[string]any{"line": c.line}); r.code() != "invalid" {
				t.Fatalf("create %q: %s, want invalid", c.line, r.code())
			}
			if r := e.req("alice", "fork", map[string]any{"source": "conv1", "line": c.line}); r.code() != "invalid" {
				t.Fatalf("fork %q: %s, want invalid", c.line, r.code())
			}
		})
	}
	if l := e.req("alice", "list", map[string]any{}); !l.OK || len(l.Sessions) != 1 {
		t.Fatalf("refused headers made conversations: %+v", l.Sessions)
	}
}
