package store_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pisync/pisync/store"
)

// TestMissingIDIsInvalid: a request without the conversation it names is a bad request,
// not a conversation that is not there.
func TestMissingIDIsInvalid(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	cases := []struct {
		op   string
		body map[string]any
	}{
		{"open", map[string]any{}},
		{"open", map[string]any{"id": ""}},
		{"append", map[string]any{"expectedHead": nil, "line": entryLine("a1b2c3d4", "", "x")}},
		{"append", map[string]any{"part": map[string]any{"sha256": strings.Repeat("0", 64), "size": 1, "offset": 0, "data": "eA=="}}},
		{"delete", map[string]any{}},
		{"fork", map[string]any{"line": headerLine("conv2", "/srv/app")}},
	}
	for _, c := range cases {
		b, _ := json.Marshal(c.body)
		t.Run(c.op+" "+string(b), func(t *testing.T) {
			if r := e.req("alice", c.op, c.body); r.code() != "invalid" {
				t.Fatalf("%s without an id: %s, want invalid", c.op, r.code())
			}
		})
	}
}

// TestDuplicateReplyHead: the reply to an append retried after later appends carries the
// head right after that entry (protocol §4), as its first reply did.
func TestDuplicateReplyHead(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	lines := []string{entryLine("a1b2c3d4", "", "x"), entryLine("b2c3d4e5", "a1b2c3d4", "y"), leafLine("c3d4e5f6", "b2c3d4e5", "a1b2c3d4"),
		entryLine("d4e5f6a7", "a1b2c3d4", "z")}
	heads := []string{"", "a1b2c3d4", "b2c3d4e5", "a1b2c3d4"} // the head each was appended on
	var first []reply
	for i, l := range lines {
		first = append(first, e.mustAppend("alice", "conv1", heads[i], l))
	}
	for i, l := range lines {
		again := e.mustAppend("alice", "conv1", heads[i], l)
		if !again.Duplicate || again.Head == nil || *again.Head != *first[i].Head {
			t.Fatalf("append %d again: duplicate %v, head %v; want the first reply's head %s", i, again.Duplicate, again.Head, *first[i].Head)
		}
	}
}
