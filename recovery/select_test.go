package recovery

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// noCounts is a mirror whose stream cannot be listed (the request is refused or times
// out): what a selection then returns could leave conversations out.
type noCounts struct{ Mirror }

func (noCounts) Conversations(context.Context) (mirror.Listing, error) {
	return mirror.Listing{}, errors.New("list the conversations in the stream: nats: timeout")
}

// TestSelectListsFromStream: the conversations come from the stream itself. A
// conversation without a head, one whose head does not decode, and a clash copy without
// a head are all selected and recovered; the bad head is reported by its key and hides
// nothing; a head without messages is selected and fails, so that the run is not OK.
// When the stream cannot be listed, Select fails instead of returning the heads alone.
func TestSelectListsFromStream(t *testing.T) {
	tm := newTestMirror(t)
	ctx := mirrortest.Ctx(t)
	golden := filepath.Join("testdata", "golden")
	publish := func(name, key string, withHead bool) ([]byte, mirrortest.Mirrored) {
		lines := mirrortest.ReadLines(t, filepath.Join(golden, name, "input.jsonl"))
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		head := mirrortest.DaemonHead(lines, m, 1)
		if key != "" {
			m.Conv, head.Key = key, key
		}
		var h *mirror.Head
		if withHead {
			h = &head
		}
		tm.Publish(t, m, m.Msgs, h)
		return mirrortest.JoinLines(lines), m
	}
	_, good := publish("complete", "", true)
	headlessFile, headless := publish("missing_middle", "", false)
	badFile, bad := publish("raw_lines", "", true)
	_, clash := publish("v1", "", true)
	clashFile, clashCopy := publish("v1", clash.Conv+"~0a1b2c3d", false)

	kv, err := tm.JS.KeyValue(ctx, tm.Names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	badConv, _ := mirror.NewConv(tm.Owner, bad.Conv)
	if _, err := kv.Put(ctx, badConv.HeadKey(), []byte(`{"conversation":`)); err != nil {
		t.Fatal(err)
	}
	onlyHead, _ := mirror.NewConv(tm.Owner, "0192f0a4-0000-7000-8000-00000000dead")
	if err := tm.Writer.PutHead(ctx, onlyHead, mirror.Head{Conversation: onlyHead.Key, Key: onlyHead.Key, Root: mirrortest.Root, Source: "x.jsonl"}); err != nil {
		t.Fatal(err)
	}

	sel, err := Select(ctx, tm.Reader, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{good.Conv, headless.Conv, bad.Conv, clash.Conv, clashCopy.Conv, onlyHead.Key}
	if !sameSet(sel.Keys, want) {
		t.Fatalf("selected %v, want %v", sel.Keys, want)
	}
	if len(sel.BadHeads) != 1 || sel.BadHeads[0].Key != badConv.HeadKey() || sel.BadHeads[0].Conversation != bad.Conv ||
		!strings.Contains(sel.BadHeads[0].Warning(), badConv.HeadKey()) {
		t.Fatalf("bad heads %+v", sel.BadHeads)
	}

	out := t.TempDir()
	reports := New(tm.Reader, Options{Out: out, Parallel: 2}).Run(ctx, sel)
	byKey := map[string]Report{}
	for _, r := range reports {
		byKey[r.Key] = r
	}
	// The clash copy and its original share a file name under --out: one is refused.
	byKey[clashCopy.Conv] = New(tm.Reader, Options{Out: t.TempDir()}).One(ctx, clashCopy.Conv)
	for key, content := range map[string][]byte{headless.Conv: headlessFile, bad.Conv: badFile, clashCopy.Conv: clashFile} {
		r := byKey[key]
		if r.Result != Written {
			t.Errorf("%s: %s (%s), want written", key, r.Result, r.Reason)
			continue
		}
		if got, _ := os.ReadFile(r.Output); !bytes.Equal(got, content) {
			t.Errorf("%s: not the mirrored file", key)
		}
	}
	if r := byKey[bad.Conv]; !strings.Contains(strings.Join(r.Notes, " "), "undecodable head") || !strings.Contains(r.HeadCheck, "does not decode") {
		t.Errorf("the report of the conversation with a bad head does not say so: %q, %q", r.HeadCheck, r.Notes)
	}
	if r := byKey[onlyHead.Key]; r.Result != Failed || !strings.Contains(r.Reason, "not found") {
		t.Errorf("head without messages: %s (%s), want failed: not found", r.Result, r.Reason)
	}
	if Summarize(reports).OK() {
		t.Error("a conversation was not written, but the run is OK")
	}
	// One by one (not in one pass), the bad head gives the same note.
	if r := New(tm.Reader, Options{Out: t.TempDir()}).One(ctx, bad.Conv); r.Result != Written || !strings.Contains(strings.Join(r.Notes, " "), "undecodable head") {
		t.Errorf("one conversation with a bad head: %s (%s), notes %q", r.Result, r.Reason, r.Notes)
	}

	// By id: the clash copy without a head comes along.
	sel, err = Select(ctx, tm.Reader, []string{clash.Conv}, false)
	if err != nil || !sameSet(sel.Keys, []string{clash.Conv, clashCopy.Conv}) {
		t.Errorf("by id: %v (%v), want the conversation and its clash copy", sel.Keys, err)
	}

	if sel, err := Select(ctx, noCounts{tm.Reader}, nil, true); err == nil {
		t.Errorf("the stream could not be listed, yet Select returned %v", sel.Keys)
	}
}
