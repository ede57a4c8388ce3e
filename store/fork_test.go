package store_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pisync/pisync/store"
)

// TestForkAllOrNothing: a fork that fails mid-copy (a replica killed, a publish refused)
// leaves nothing open, list, append or create can see; the same request again completes
// it from the snapshot of the source the first attempt read, and answers ok again after
// that (the reply of a completed fork may be lost too). A source deleted before the fork
// completes makes the retry fail, and the fork is gone.
func TestForkAllOrNothing(t *testing.T) {
	const entries = 30
	cases := []struct {
		name       string
		failAt     int    // the copy fails before this entry
		between    string // what happens to the source between the attempts
		wantCode   string // of the retry
		wantLength int    // entries of the completed fork
	}{
		{"fails before the first entry", 0, "", "ok", entries},
		{"fails mid-copy", entries / 2, "", "ok", entries},
		{"fails before the last entry", entries - 1, "", "ok", entries},
		{"source appended to meanwhile", 10, "append", "ok", entries},
		{"source deleted meanwhile", 10, "delete", "not_found", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2, store.Options{})
			e.create("alice", "src")
			head := ""
			var lines []string
			for i := 0; i < entries; i++ {
				id := fmt.Sprintf("e%07d", i)
				l := entryLine(id, head, fmt.Sprintf("entry %d", i))
				e.mustAppend("alice", "src", head, l)
				lines, head = append(lines, l), id
			}
			for _, s := range e.stores {
				store.SetForkCopyFault(s, func(n int) error {
					if n == tc.failAt {
						return errors.New("injected: replica killed mid-copy")
					}
					return nil
				})
			}
			fork := map[string]any{"source": "src", "line": headerLine("fork1", "/srv/app")}
			if r := e.req("alice", "fork", fork); r.code() != "unavailable" {
				t.Fatalf("fork with a failing copy: %s %+v", r.code(), r.Error)
			}
			// Nothing of the fork is visible.
			if r := e.req("alice", "open", map[string]any{"id": "fork1"}); r.code() != "not_found" {
				t.Fatalf("open of the incomplete fork: %s, %d entries", r.code(), len(r.Entries))
			}
			if l := e.req("alice", "list", map[string]any{}); !l.OK || len(l.Sessions) != 1 || l.Sessions[0].ID != "src" {
				t.Fatalf("list shows the incomplete fork: %+v", l.Sessions)
			}
			if r := e.req("alice", "append", appendReq("fork1", "", entryLine("ffff0000", "", "x"))); r.code() != "not_found" {
				t.Fatalf("append to the incomplete fork: %s", r.code())
			}
			if r := e.req("alice", "create", map[string]any{"line": headerLine("fork1", "/srv/app")}); r.OK {
				t.Fatalf("create with the fork's header answered ok: %+v", r.Meta)
			}
			for _, s := range e.stores {
				store.SetForkCopyFault(s, nil)
			}
			switch tc.between {
			case "append":
				e.mustAppend("alice", "src", head, entryLine("f0000000", head, "later"))
			case "delete":
				if r := e.req("alice", "delete", map[string]any{"id": "src"}); !r.OK {
					t.Fatalf("delete: %+v", r.Error)
				}
			}
			for attempt := 0; attempt < 2; attempt++ { // the retry, and a retry of the retry
				r := e.req("alice", "fork", fork)
				if r.code() != tc.wantCode {
					t.Fatalf("retry %d: %s %+v", attempt, r.code(), r.Error)
				}
				if r.OK && r.Meta.Entries != int64(tc.wantLength) {
					t.Fatalf("retry %d: meta.entries %d, want %d", attempt, r.Meta.Entries, tc.wantLength)
				}
			}
			if tc.wantCode != "ok" {
				if r := e.req("alice", "open", map[string]any{"id": "fork1"}); r.code() != "not_found" {
					t.Fatalf("open of the failed fork: %s", r.code())
				}
				return
			}
			_, got := e.openAll("alice", "fork1")
			if strings.Join(got, "\n") != strings.Join(lines[:tc.wantLength], "\n") {
				t.Fatalf("fork holds %d entries, want %d", len(got), tc.wantLength)
			}
			if n := len(e.streamMsgs("alice", "fork1")); n != tc.wantLength+1 {
				t.Fatalf("fork has %d messages in the stream, want %d", n, tc.wantLength+1)
			}
			if l := e.req("alice", "list", map[string]any{}); !l.OK || len(l.Sessions) != 2 {
				t.Fatalf("list after the fork completed: %+v", l.Sessions)
			}
			// The fork is a conversation like another: it is appended to on its head.
			e.mustAppend("alice", "fork1", head, entryLine("f1000000", head, "on the fork"))
		})
	}
}

// TestForkRetriedConcurrently: the same fork sent several times at once (a client
// retrying while its first attempt is still at work on another replica) is made once,
// and every attempt answers with the complete fork.
func TestForkRetriedConcurrently(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "src")
	head := ""
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("e%07d", i)
		e.mustAppend("alice", "src", head, entryLine(id, head, "x"))
		head = id
	}
	fork := map[string]any{"source": "src", "line": headerLine("fork1", "/srv/app")}
	res := make([]reply, 4)
	var wg sync.WaitGroup
	for i := range res {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res[i] = e.req("alice", "fork", fork)
		}(i)
	}
	wg.Wait()
	for i, r := range res {
		if !r.OK || r.Meta.Entries != 200 || r.Meta.Head == nil || *r.Meta.Head != head {
			t.Fatalf("attempt %d: %s %+v %+v", i, r.code(), r.Error, r.Meta)
		}
	}
	if n := len(e.streamMsgs("alice", "fork1")); n != 201 {
		t.Fatalf("fork has %d messages, want 201", n)
	}
}
