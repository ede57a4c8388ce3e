package mirror_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestListingMerges: the keys of a listing are the stream's conversations and those with
// a head, usable or not, each once; a bad head whose bucket key does not decode names no
// conversation; a head written before keys were recorded is found by its id.
func TestListingMerges(t *testing.T) {
	errBad := fmt.Errorf("%w: unexpected end of JSON input", mirror.ErrBadHead)
	for _, tc := range []struct {
		name      string
		l         mirror.Listing
		keys      []string
		byKey     []string // keys of ByKey
		headErrs  []string // keys of HeadErrors
		noHeadFor []string // keys of Keys that ByKey lacks
	}{
		{name: "empty", keys: []string{}, byKey: nil, headErrs: nil, noHeadFor: nil},
		{
			name:  "heads and counts agree",
			l:     mirror.Listing{Heads: []mirror.Head{{Key: "a"}, {Key: "b"}}, Counts: map[string]uint64{"a": 3, "b": 1}},
			keys:  []string{"a", "b"},
			byKey: []string{"a", "b"},
		},
		{
			name:      "messages without a head",
			l:         mirror.Listing{Heads: []mirror.Head{{Key: "a"}}, Counts: map[string]uint64{"a": 3, "c": 2}},
			keys:      []string{"a", "c"},
			byKey:     []string{"a"},
			noHeadFor: []string{"c"},
		},
		{
			name:  "a head without messages",
			l:     mirror.Listing{Heads: []mirror.Head{{Key: "a"}, {Key: "z"}}, Counts: map[string]uint64{"a": 3}},
			keys:  []string{"a", "z"},
			byKey: []string{"a", "z"},
		},
		{
			name:      "a bad head, with messages and without",
			l:         mirror.Listing{Bad: []mirror.BadHead{{Key: "t.o.b", Conversation: "b", Err: errBad}, {Key: "t.o.d", Conversation: "d", Err: errBad}}, Counts: map[string]uint64{"b": 4}},
			keys:      []string{"b", "d"},
			headErrs:  []string{"b", "d"},
			noHeadFor: []string{"b", "d"},
		},
		{
			name:      "a bad head whose key does not decode",
			l:         mirror.Listing{Bad: []mirror.BadHead{{Key: "t.o.=zz", Err: errBad}}, Counts: map[string]uint64{"a": 1}},
			keys:      []string{"a"},
			headErrs:  nil,
			noHeadFor: []string{"a"},
		},
		{
			name:  "a head written before keys were recorded",
			l:     mirror.Listing{Heads: []mirror.Head{{Conversation: "old"}}, Counts: map[string]uint64{"old": 2}},
			keys:  []string{"old"},
			byKey: []string{"old"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.Keys(); !slices.Equal(got, tc.keys) {
				t.Errorf("Keys: %v, want %v", got, tc.keys)
			}
			byKey := tc.l.ByKey()
			if got := slices.Sorted(maps.Keys(byKey)); !slices.Equal(got, tc.byKey) {
				t.Errorf("ByKey: %v, want %v", got, tc.byKey)
			}
			errs := tc.l.HeadErrors()
			if got := slices.Sorted(maps.Keys(errs)); !slices.Equal(got, tc.headErrs) {
				t.Errorf("HeadErrors: %v, want %v", got, tc.headErrs)
			}
			for key, err := range errs {
				if !errors.Is(err, mirror.ErrBadHead) {
					t.Errorf("HeadErrors[%s] = %v, want an ErrBadHead", key, err)
				}
			}
			var noHead []string
			for _, key := range tc.l.Keys() {
				if _, ok := byKey[key]; !ok {
					noHead = append(noHead, key)
				}
			}
			if !slices.Equal(noHead, tc.noHeadFor) {
				t.Errorf("without a usable head: %v, want %v", noHead, tc.noHeadFor)
			}
		})
	}
}

// TestConversations: the listing of a real mirror holds a conversation with its head, one
// without, one whose head does not decode and a head without messages, and no other
// owner's; when the stream cannot be listed, it fails rather than return the heads alone.
func TestConversations(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	other := mirrortest.For(t, tm.JS.Conn().ConnectedUrl(), "t1", "bob")
	lines := [][]byte{
		[]byte(`{"type":"session","version":3,"id":"c-good","timestamp":"2026-11-01T10:00:00.000Z","cwd":"/p"}`),
		[]byte(`{"type":"message","id":"a1","parentId":null,"timestamp":"2026-11-01T10:00:01.000Z","message":{"role":"user","content":"hi"}}`),
	}
	publish := func(tm *mirrortest.Mirror, key string, withHead bool) {
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		head := mirrortest.DaemonHead(lines, m, 1)
		m.Conv, head.Conversation, head.Key = key, key, key
		var h *mirror.Head
		if withHead {
			h = &head
		}
		tm.Publish(t, m, m.Msgs, h)
	}
	publish(tm, "c-good", true)
	publish(tm, "c-headless", false)
	publish(tm, "c-bad", true)
	publish(other, "c-bob", true)
	kv, err := tm.JS.KeyValue(ctx, tm.Names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := mirror.NewConv(tm.Owner, "c-bad")
	if _, err := kv.Put(ctx, bad.HeadKey(), []byte(`{"conversation":`)); err != nil {
		t.Fatal(err)
	}
	onlyHead, _ := mirror.NewConv(tm.Owner, "c-only-head")
	if err := tm.Writer.PutHead(ctx, onlyHead, mirror.Head{Conversation: onlyHead.Key, Key: onlyHead.Key}); err != nil {
		t.Fatal(err)
	}

	l, err := tm.Reader.Conversations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"c-bad", "c-good", "c-headless", "c-only-head"}; !slices.Equal(l.Keys(), want) {
		t.Errorf("keys %v, want %v", l.Keys(), want)
	}
	if want := map[string]uint64{"c-good": 2, "c-headless": 2, "c-bad": 2}; !maps.Equal(l.Counts, want) {
		t.Errorf("counts %v, want %v", l.Counts, want)
	}
	var heads []string
	for _, h := range l.Heads {
		heads = append(heads, h.ConvKey())
	}
	if want := []string{"c-good", "c-only-head"}; !slices.Equal(heads, want) {
		t.Errorf("heads %v, want %v", heads, want)
	}
	if len(l.Bad) != 1 || l.Bad[0].Key != bad.HeadKey() || l.Bad[0].Conversation != "c-bad" || !errors.Is(l.Bad[0].Err, mirror.ErrBadHead) {
		t.Errorf("bad heads %+v, want the one of c-bad", l.Bad)
	}

	if err := tm.JS.DeleteStream(ctx, tm.Names.Stream()); err != nil {
		t.Fatal(err)
	}
	if l, err := tm.Reader.Conversations(ctx); err == nil {
		t.Errorf("the stream cannot be listed, yet Conversations returned %v", l.Keys())
	}
}
