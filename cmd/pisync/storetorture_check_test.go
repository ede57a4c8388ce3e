package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/pisync/pisync/internal/testutil/pitest"
)

// The store torture's model of what the store acknowledged, its operations, and the
// invariants checked at quiet points.

type tLine struct {
	id, parent, target, line string
	leaf                     bool
}

// tConv is what the clients know of one conversation.
type tConv struct {
	id, header string
	entries    []tLine // acknowledged, in order
	// What no answer came for: appends that may be stored (each right after the head it
	// was sent on); a fork that is absent or holds exactly forked; a create or delete
	// that may or may not have happened.
	maybe           []tLine
	forked          []tLine
	unsure, deleted bool
}

func (c *tConv) head() string {
	if len(c.entries) == 0 {
		return ""
	}
	if e := c.entries[len(c.entries)-1]; e.leaf {
		return e.target
	}
	return c.entries[len(c.entries)-1].id
}

func (c *tConv) settled() bool { return len(c.maybe) == 0 && !c.unsure }

type tModel struct {
	seed  uint64
	next  int
	convs map[string]*tConv
	gone  []string // deleted: absent from list and open
}

func newTModel(seed uint64) *tModel { return &tModel{seed: seed, convs: map[string]*tConv{}} }

func (m *tModel) newID() string {
	m.next++
	return fmt.Sprintf("%08x", uint32(m.seed)+uint32(m.next)*2654435761)
}

func (m *tModel) ids() []string {
	var ids []string
	for id := range m.convs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func tHeader(id, cwd string) string {
	return fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-05T10:00:00.000Z","cwd":%q}`, id, cwd)
}

func tMessage(id, parent, text string) tLine {
	p := "null"
	if parent != "" {
		p = fmt.Sprintf("%q", parent)
	}
	t, _ := json.Marshal(text)
	return tLine{id: id, parent: parent, line: fmt.Sprintf(`{"type":"message","id":%q,"parentId":%s,"timestamp":"2026-12-05T10:00:01.000Z","message":{"role":"user","content":[{"type":"text","text":%s}],"timestamp":1764928801000}}`, id, p, t)}
}

func tLeaf(id, parent, target string) tLine {
	return tLine{id: id, parent: parent, target: target, leaf: true,
		line: fmt.Sprintf(`{"type":"leaf","id":%q,"parentId":%q,"timestamp":"2026-12-05T10:00:02.000Z","targetId":%q}`, id, parent, target)}
}

// do runs one operation other than kill, nats-restart and check.
func (st *storeTorture) do(op string) {
	t, m, c := st.t, st.model, st.client
	ids := m.ids()
	var conv *tConv
	if len(ids) > 0 {
		conv = m.convs[ids[st.rng.IntN(len(ids))]]
		if !st.settle(conv) {
			return
		}
	}
	switch {
	case op == "create" || conv == nil:
		id := m.newID()
		nc := &tConv{id: id, header: tHeader(id, fmt.Sprintf("/srv/app%d", st.rng.IntN(3)))}
		m.convs[id] = nc
		r, _, err := c.call("create", map[string]any{"line": nc.header})
		switch {
		case errors.Is(err, errUndetermined):
			nc.unsure = true
		case err != nil || !r.OK || r.Meta.ID != id:
			t.Errorf("create %s: %s %+v %v", id, r.code(), r.Error, err)
		case st.rng.IntN(3) == 0:
			if again, _, err := c.call("create", map[string]any{"line": nc.header}); err == nil && (!again.OK || again.Seq != r.Seq) {
				t.Errorf("create %s again: %s seq %d, want ok with seq %d", id, again.code(), again.Seq, r.Seq)
			}
		}
	case op == "append":
		st.appendRound(conv)
	case op == "fork":
		st.fork(conv)
	case op == "delete":
		r, lost, err := c.call("delete", map[string]any{"id": conv.id})
		switch {
		case errors.Is(err, errUndetermined):
			conv.deleted, conv.unsure = true, true
		case r.OK || r.code() == "not_found" && lost:
			delete(m.convs, conv.id)
			m.gone = append(m.gone, conv.id)
		default:
			t.Errorf("delete %s: %s %+v %v", conv.id, r.code(), r.Error, err)
		}
	case op == "open":
		st.checkOpen(conv)
	case op == "list":
		st.checkList()
	}
}

// appendRound has 1 to 4 clients append to conv at once, some on a stale head, some
// sending again a request whose reply they had.
func (st *storeTorture) appendRound(conv *tConv) {
	t, m := st.t, st.model
	type attempt struct {
		expected string
		line     tLine
		replay   bool
		r        tReply
		err      error
	}
	k := 1 + st.rng.IntN(4)
	as := make([]*attempt, k)
	for i := range as {
		a := &attempt{expected: conv.head(), replay: st.rng.IntN(4) == 0}
		if n := len(conv.entries); n > 1 && st.rng.IntN(4) == 0 {
			if a.expected = conv.entries[st.rng.IntN(n-1)].id; a.expected == conv.head() { // stale
				a.expected = "" // a leaf moved back to it: null is stale then
			}
		}
		id := m.newID()
		switch n := len(conv.entries); {
		case n > 1 && st.rng.IntN(8) == 0:
			a.line = tLeaf(id, a.expected, conv.entries[st.rng.IntN(n)].id)
		case st.rng.IntN(25) == 0: // above max_payload: uploaded in parts
			a.line = tMessage(id, a.expected, strings.Repeat(fmt.Sprintf("%s big ", id), 100_000))
		case st.rng.IntN(25) == 0: // above a small max_payload, below the blob threshold
			a.line = tMessage(id, a.expected, strings.Repeat(fmt.Sprintf("%s mid ", id), 25_000))
		default:
			a.line = tMessage(id, a.expected, fmt.Sprintf("entry %s of client %d", id, i))
		}
		if a.line.leaf && a.expected == "" {
			a.line = tMessage(id, a.expected, "root")
		}
		as[i] = a
	}
	var wg sync.WaitGroup
	for _, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.r, _, a.err = st.client.appendLine(conv.id, a.expected, a.line.line)
			if a.err == nil && a.r.OK && a.replay {
				again, _, err := st.client.appendLine(conv.id, a.expected, a.line.line)
				if err == nil && (!again.OK || !again.Duplicate || again.Seq != a.r.Seq || again.Ordinal != a.r.Ordinal || !sameHead(again.Head, a.r.Head)) {
					t.Errorf("append %s sent again: %s seq %d ordinal %d head %v duplicate %v; want seq %d ordinal %d head %v",
						a.line.id, again.code(), again.Seq, again.Ordinal, deref(again.Head), again.Duplicate, a.r.Seq, a.r.Ordinal, deref(a.r.Head))
				}
			}
		}()
	}
	wg.Wait()
	var acked []*attempt
	for _, a := range as {
		switch {
		case errors.Is(a.err, errUndetermined):
			conv.maybe = append(conv.maybe, a.line)
		case a.err != nil:
			t.Errorf("append %s: %v", a.line.id, a.err)
		case a.r.OK:
			acked = append(acked, a)
		case a.r.code() != "conflict":
			t.Errorf("append %s on %q: %s %+v", a.line.id, a.expected, a.r.code(), a.r.Error)
		}
	}
	slices.SortFunc(acked, func(a, b *attempt) int { return int(a.r.Ordinal - b.r.Ordinal) })
	for _, a := range acked {
		if want := int64(len(conv.entries) + 1); a.r.Ordinal != want || a.expected != conv.head() {
			t.Errorf("append %s acknowledged at ordinal %d on head %q; the conversation had %d entries and head %q: a head extended twice, or a hole",
				a.line.id, a.r.Ordinal, a.expected, want-1, conv.head())
		}
		conv.entries = append(conv.entries, a.line)
		if got, want := deref(a.r.Head), conv.head(); got != want {
			t.Errorf("append %s: reply head %q, want %q", a.line.id, got, want)
		}
	}
}

// fork forks conv whole or at one of its entries, as Pi's getPathToRootOrCompaction.
func (st *storeTorture) fork(src *tConv) {
	m := st.model
	id := m.newID()
	body := map[string]any{"source": src.id, "line": tHeader(id, "/srv/fork")}
	want := slices.Clone(src.entries)
	if n := len(src.entries); n > 0 && st.rng.IntN(2) == 0 {
		// Not at a leaf record: its target can be off the path, and the fork's head then
		// names an entry it lacks (Pi's JSONL fork makes the same file, whose next append
		// Pi writes with a missing parent and the store refuses as invalid).
		at := src.entries[st.rng.IntN(n)]
		for at.leaf {
			at = byParent(src.entries, at)
		}
		body["entryId"], body["position"] = at.id, "at"
		byID := map[string]tLine{}
		for _, e := range src.entries {
			byID[e.id] = e
		}
		want = nil
		for e, ok := at, true; ok; e, ok = byID[e.parent] {
			want = append(want, e)
		}
		slices.Reverse(want)
	}
	nc := &tConv{id: id, header: body["line"].(string)}
	m.convs[id] = nc
	r, _, err := st.client.call("fork", body)
	switch {
	case errors.Is(err, errUndetermined):
		nc.unsure, nc.forked = true, want
	case err != nil || !r.OK || r.Meta.Entries != int64(len(want)):
		st.t.Errorf("fork %s of %s: %s %+v, %d entries, want %d (%v)", id, src.id, r.code(), r.Error, r.Meta.Entries, len(want), err)
	default:
		nc.entries = want
		if st.rng.IntN(3) == 0 {
			if again, _, err := st.client.call("fork", body); err == nil && (!again.OK || again.Meta.Entries != int64(len(want))) {
				st.t.Errorf("fork %s sent again: %s %+v", id, again.code(), again.Error)
			}
		}
	}
}

// settle learns from open what became of the requests no answer came for, and checks
// that it is one of the outcomes allowed: an append stored right after the head it was
// sent on or not at all, a fork absent or complete. false: conv is gone.
func (st *storeTorture) settle(conv *tConv) bool {
	if conv.settled() {
		return true
	}
	r, lines, _, err := st.client.open(conv.id)
	if err != nil {
		st.t.Errorf("settle %s: %v", conv.id, err)
		return false
	}
	if r.code() == "not_found" {
		if len(conv.entries) > 0 && !conv.deleted {
			st.t.Errorf("%s: not found, with %d acknowledged entries", conv.id, len(conv.entries))
		}
		delete(st.model.convs, conv.id)
		if conv.deleted {
			st.model.gone = append(st.model.gone, conv.id)
		}
		return false
	}
	if !r.OK {
		st.t.Errorf("settle %s: %s %+v", conv.id, r.code(), r.Error)
		return false
	}
	if conv.forked != nil {
		conv.entries = conv.forked
	}
	known := map[string]tLine{}
	for _, e := range append(slices.Clone(conv.entries), conv.maybe...) {
		known[e.line] = e
	}
	var got []tLine
	acked := 0
	for _, l := range lines {
		e, ok := known[l]
		if !ok {
			st.t.Errorf("%s holds a line no client sent: %.200s", conv.id, l)
			return false
		}
		if acked < len(conv.entries) && conv.entries[acked].line == l {
			acked++
		}
		got = append(got, e)
	}
	if acked != len(conv.entries) || len(got) != len(conv.entries) && conv.forked != nil {
		st.t.Errorf("%s: open holds %d lines, %d of the %d acknowledged (or forked) in order", conv.id, len(got), acked, len(conv.entries))
		return false
	}
	conv.entries, conv.maybe, conv.forked, conv.unsure, conv.deleted = got, nil, nil, false, false
	return true
}

// checkOpen checks open of conv against the model: every acknowledged entry, in order,
// ordinals 1..n, the head.
func (st *storeTorture) checkOpen(conv *tConv) {
	if !st.settle(conv) {
		return
	}
	r, lines, ordinals, err := st.client.open(conv.id)
	if err != nil || !r.OK {
		st.t.Errorf("open %s: %s %v", conv.id, r.code(), err)
		return
	}
	for i, e := range conv.entries {
		if i >= len(lines) || lines[i] != e.line || ordinals[i] != int64(i+1) {
			st.t.Errorf("open %s: entry %d differs (%d lines, want %d)", conv.id, i+1, len(lines), len(conv.entries))
			return
		}
	}
	if len(lines) != len(conv.entries) || deref(r.Head) != conv.head() || r.Meta.Entries != int64(len(lines)) {
		st.t.Errorf("open %s: %d lines, head %q, meta.entries %d; want %d and %q", conv.id, len(lines), deref(r.Head), r.Meta.Entries, len(conv.entries), conv.head())
	}
}

// checkList checks that list shows exactly the conversations there are, with their
// entries and head.
func (st *storeTorture) checkList() {
	listed, err := st.client.list()
	if err != nil {
		st.t.Errorf("list: %v", err)
		return
	}
	seen := map[string]bool{}
	for _, l := range listed {
		seen[l.ID] = true
		conv, ok := st.model.convs[l.ID]
		switch {
		case !ok:
			st.t.Errorf("list shows %s, which is not there (deleted: %v)", l.ID, slices.Contains(st.model.gone, l.ID))
		case conv.forked != nil && l.Entries != int64(len(conv.forked)):
			st.t.Errorf("list shows fork %s with %d of its %d entries", l.ID, l.Entries, len(conv.forked))
		case conv.settled() && (l.Entries != int64(len(conv.entries)) || deref(l.Head) != conv.head()):
			st.t.Errorf("list shows %s with %d entries, head %q; want %d and %q", l.ID, l.Entries, deref(l.Head), len(conv.entries), conv.head())
		}
	}
	for id, conv := range st.model.convs {
		if conv.settled() && !seen[id] {
			st.t.Errorf("list lacks %s", id)
		}
	}
}

// check is a quiet point: every conversation settled and opened as the model says, list
// the same, deleted ones gone, recover of each equal to what open returns, the logs clean.
func (st *storeTorture) check() {
	for _, id := range st.model.ids() {
		st.checkOpen(st.model.convs[id])
	}
	st.checkList()
	for _, id := range st.model.gone {
		if r, _, err := st.client.call("open", map[string]any{"id": id}); err != nil || r.code() != "not_found" {
			st.t.Errorf("open of deleted %s: %s %v", id, r.code(), err)
		}
	}
	st.checkRecover()
	st.logsClean()
}

// checkRecover runs `pisync recover --all --out` and compares each conversation's file
// with its header and the lines open returns.
func (st *storeTorture) checkRecover() {
	out := st.t.TempDir()
	cmd := exec.Command(st.bin, "recover", "--all", "--out", out, "--nats", st.srv.URL(), "--tenant", "t1", "--owner", "alice", "--json")
	if b, err := cmd.CombinedOutput(); err != nil {
		st.t.Errorf("recover --all: %v\n%.2000s", err, b)
		return
	}
	files := map[string]string{}
	_ = filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			base := strings.TrimSuffix(filepath.Base(p), ".jsonl")
			files[base[strings.LastIndexByte(base, '_')+1:]] = p
		}
		return nil
	})
	for id, conv := range st.model.convs {
		p, ok := files[id]
		if !ok {
			st.t.Errorf("recover wrote no file for %s", id)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			st.t.Error(err)
			continue
		}
		want := conv.header + "\n"
		for _, e := range conv.entries {
			want += e.line + "\n"
		}
		if string(b) != want {
			st.t.Errorf("recover of %s differs from open: %d bytes, want %d", id, len(b), len(want))
		}
	}
	st.piReads(files)
}

// piReads has Pi's JsonlSessionRepo (the harness loader) read every recovered file: it
// must open each and find the entries open returned, in order.
func (st *storeTorture) piReads(files map[string]string) {
	pi := pitest.New(st.t)
	var reqs []pitest.DumpRequest
	for id := range st.model.convs {
		if p, ok := files[id]; ok {
			reqs = append(reqs, pitest.DumpRequest{Path: p, Loader: "harness"})
		}
	}
	if len(reqs) == 0 {
		return
	}
	dumps := pi.DumpMany(st.t, reqs)
	for id, conv := range st.model.convs {
		d, ok := dumps[files[id]]
		if !ok {
			continue
		}
		if d.Error != "" {
			st.t.Errorf("Pi refuses the recovered %s: %s", id, d.Error)
			continue
		}
		var got, want []string
		for _, e := range d.Dump.Entries {
			got = append(got, e.ID)
		}
		for _, e := range conv.entries {
			want = append(want, e.id)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			st.t.Errorf("Pi reads the recovered %s as entries %v; open returned %v", id, got, want)
		}
	}
}

// byParent is the entry e's parent is (e is a leaf record, whose parent is the entry the
// leaf was at before it moved; a leaf record is never the first entry).
func byParent(entries []tLine, e tLine) tLine {
	for _, p := range entries {
		if p.id == e.parent {
			return p
		}
	}
	return entries[0]
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func sameHead(a, b *string) bool { return deref(a) == deref(b) }
