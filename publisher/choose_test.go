package publisher

import (
	"fmt"
	"testing"

	"github.com/pisync/pisync/watcher"
)

// Each row of these tables is a case a torture finding taught (torture/FINDINGS.md), or
// the ordinary case next to it. The lookups a row answers are made only when the
// decision asks for them (asked): a replacement's key costs no head read, and the record
// a missed replacement left is removed only when its key is taken.

// TestChooseKey: where a file's conversation key comes from, before its claim.
func TestChooseKey(t *testing.T) {
	const id = "c1"
	type answers struct{ replacedHere, recorded, previous lookup }
	no := lookup{asked: true}
	rec := func(key string, header, here bool) keyFacts {
		return keyFacts{record: true, recordHeader: header, recordHere: here, recordKey: key}
	}
	for _, tc := range []struct {
		name   string
		facts  keyFacts
		answer answers
		key    string
		why    keyReason
		record bool // the checkpoint record is the file's
		reused bool
		asked  []keyNeed
		// diverged: the key previous finds is a diverged one
		diverged bool
	}{
		{name: "a file met for the first time: the conversation id, after asking the records and the mirror",
			answer: answers{recorded: no, previous: no},
			key:    id, why: keyID, asked: []keyNeed{needRecorded, needPrevious}},
		{name: "a start: the checkpoint record holds the key (T8: both keys of a clash come back from checkpoints)",
			facts: rec(id+"~aaaaaaaa", true, true),
			key:   id + "~aaaaaaaa", why: keyCheckpoint, record: true},
		{name: "T3: reopened under its identity (moved, rewritten in place): keeps its state's key",
			facts: keyFacts{reopened: id + "~aaaaaaaa", known: true},
			key:   id + "~aaaaaaaa", why: keyReopened},
		{name: "T3: a replacement the daemon saw keeps the replaced file's clash key, no lookup made",
			facts: keyFacts{replaced: id + "~aaaaaaaa"},
			key:   id + "~aaaaaaaa", why: keyReplaced},
		{name: "T3: a replacement's key wins over the record of its own identity",
			facts: keyFacts{replaced: id + "~aaaaaaaa", record: true, recordHeader: true, recordHere: true, recordKey: id},
			key:   id + "~aaaaaaaa", why: keyReplaced, record: true},
		{name: "T3: a replacement the daemon missed keeps the clash key its predecessor's record holds for the path",
			answer: answers{recorded: answer(id+"~aaaaaaaa", true)},
			key:    id + "~aaaaaaaa", why: keyRecorded, asked: []keyNeed{needRecorded}},
		{name: "T3, T8, T15: after a state loss the mirror's head names the file under its clash key (reported again)",
			answer: answers{recorded: no, previous: answer(id+"~bbbbbbbb", true)},
			key:    id + "~bbbbbbbb", why: keyPrevious, asked: []keyNeed{needRecorded, needPrevious}},
		{name: "T18: moved while stopped, no record of its session names the new path: its record, kept as moved",
			facts:  rec(id+"~aaaaaaaa", true, false),
			answer: answers{replacedHere: no},
			key:    id + "~aaaaaaaa", why: keyCheckpoint, record: true, asked: []keyNeed{needReplacedHere}},
		{name: "T26: a reused inode number, a record of its session names the file's path: not its record, the path's key",
			facts:  rec(id, true, false),
			answer: answers{replacedHere: answer("", true), recorded: answer(id+"~cccccccc", true)},
			key:    id + "~cccccccc", why: keyRecorded, reused: true, asked: []keyNeed{needReplacedHere, needRecorded}},
		{name: "T26: the same where the path had the plain id (the claim gives it back)",
			facts:  rec(id+"~cccccccc", true, false),
			answer: answers{replacedHere: answer("", true), recorded: no, previous: no},
			key:    id, why: keyID, reused: true, asked: []keyNeed{needReplacedHere, needRecorded, needPrevious}},
		{name: "an inode number reused by another file (line 1 differs): not its record, nothing asked of it",
			facts:  rec(id+"~aaaaaaaa", false, true),
			answer: answers{recorded: no, previous: no},
			key:    id, why: keyID, asked: []keyNeed{needRecorded, needPrevious}},
		{name: "a move the daemon saw: the record names the old path and is the file's, no record asked about",
			facts: keyFacts{reopened: id + "~aaaaaaaa", known: true, record: true, recordHeader: true, recordKey: id + "~aaaaaaaa"},
			key:   id + "~aaaaaaaa", why: keyReopened, record: true},
		{name: "failover: after a state loss the mirror's head names the file under its diverged key (no clash)",
			answer: answers{recorded: no, previous: answer(id+"~dddddddd", true)}, diverged: true,
			key: id + "~dddddddd", why: keyDiverged, asked: []keyNeed{needRecorded, needPrevious}},
		{name: "a record without a key: the chain goes on, the record still the file's",
			facts:  rec("", true, true),
			answer: answers{recorded: no, previous: no},
			key:    id, why: keyID, record: true, asked: []keyNeed{needRecorded, needPrevious}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.facts
			k.id = id
			c, asked := decided(t, k, chooseKey, func(c keyChoice) keyNeed { return c.need }, func(k *keyFacts, n keyNeed) {
				switch n {
				case needReplacedHere:
					k.replacedHere = tc.answer.replacedHere
				case needRecorded:
					k.recorded = tc.answer.recorded
				case needPrevious:
					k.previous, k.previousDiverged = tc.answer.previous, tc.diverged
				}
			})
			got := fmt.Sprintf("key %q why %d record %v reused %v asked %v", c.key, c.why, c.record, c.reusedHere, asked)
			want := fmt.Sprintf("key %q why %d record %v reused %v asked %v", tc.key, tc.why, tc.record, tc.reused, tc.asked)
			if got != want {
				t.Errorf("got %s\nwant %s", got, want)
			}
		})
	}
}

// TestChooseClaim: whether a file gets the key it claims, or one derived from it.
func TestChooseClaim(t *testing.T) {
	gone, there := answer("", true), answer("", false)
	for _, tc := range []struct {
		name     string
		facts    claimFacts
		vanished lookup
		take     bool
		why      claimReason
		asked    bool // whether the holder's file was looked for
	}{
		{name: "a free key", take: true, why: claimFree},
		{name: "its own claim", facts: claimFacts{taken: true, self: true}, take: true, why: claimOwn},
		{name: "T28: an Open in progress claimed this key: it keeps it",
			facts: claimFacts{taken: true, openingIt: true, stateHolds: true}, why: claimOpening},
		{name: "T28: an Open in progress under the holder's (reused) inode number claimed another key; the holder's file left its path",
			facts: claimFacts{taken: true, stateHolds: true}, vanished: gone, take: true, why: claimStale, asked: true},
		{name: "a live copy carries the key", facts: claimFacts{taken: true, stateHolds: true}, vanished: there,
			why: claimLive, asked: true},
		{name: "the holder's file was deleted (Gone) or skipped, or its state carries another key",
			facts: claimFacts{taken: true}, take: true, why: claimStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := chooseClaim(tc.facts)
			asked := c.needVanished
			if asked {
				tc.facts.vanished = tc.vanished
				c = chooseClaim(tc.facts)
			}
			if c.needVanished || c.take != tc.take || c.why != tc.why || asked != tc.asked {
				t.Errorf("take %v why %d asked %v (need %v), want take %v why %d asked %v",
					c.take, c.why, asked, c.needVanished, tc.take, tc.why, tc.asked)
			}
		})
	}
}

// TestContestedKey (T27): the loser of a contested claim takes the key derived from the
// session id and its own path, which a start without state finds again.
func TestContestedKey(t *testing.T) {
	const id = "c1"
	f := watcher.File{Root: "/r", Rel: "--w--/s.jsonl"}
	own := clashKey(id, f)
	moved := clashKey(id, watcher.File{Root: "/r", Rel: "--w--/before.jsonl"})
	for _, tc := range []struct {
		name, contested, want string
	}{
		{"the plain id, held by a copy", id, own},
		{"T27: a clash key a moved copy kept: derived from the id, not id~a~b", moved, own},
		{"its own path's key, kept by the file that moved away from the path", own, clashKey(own, f)},
	} {
		if got := contestedKey(id, tc.contested, f); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, ok := clashKeyID(own); !ok {
		t.Errorf("%q is not found again as a clash key of %q", own, id)
	}
}

// TestChooseStart: a file resumes from its record's frontier, or is compared whole with
// the mirror.
func TestChooseStart(t *testing.T) {
	const off, mt = 1000, 111
	base := startFacts{record: true, why: watcher.Discovered, offset: off, recMTime: mt, size: off, mtime: mt}
	with := func(f func(*startFacts)) startFacts {
		s := base
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name     string
		facts    startFacts
		lastLine bool // the record's last line is in place, when asked
		why      startReason
		asked    bool
	}{
		{"unchanged at a start: from the frontier", base, true, startCheckpoint, true},
		{"no record", startFacts{why: watcher.Discovered, size: off}, true, startNoRecord, false},
		{"truncated", with(func(s *startFacts) { s.why = watcher.Truncated }), true, startRewritten, false},
		{"replaced", with(func(s *startFacts) { s.why = watcher.Replaced }), true, startRewritten, false},
		{"T1, T13: rechecked (a resumed tail changed, or a settled check failed)",
			with(func(s *startFacts) { s.why = watcher.Rechecked }), true, startRewritten, false},
		{"T18: moved while stopped, its last line in place", with(func(s *startFacts) { s.why = watcher.Moved }), true, startCheckpoint, true},
		{"a record of the file deleted", with(func(s *startFacts) { s.deleted = true }), true, startDeleted, false},
		{"cut back below the frontier while stopped", with(func(s *startFacts) { s.size = off - 1 }), true, startShorter, false},
		{"its last line changed", base, false, startChanged, true},
		{"T13: stopped while the settled check of a change was pending",
			with(func(s *startFacts) { s.unsettled = true }), true, startUnsettled, true},
		{"T13: unsettled, and its last line changed too", with(func(s *startFacts) { s.unsettled = true }), false, startChanged, true},
		{"T13: written while no watcher ran, ending where the record says",
			with(func(s *startFacts) { s.mtime = mt + 1 }), true, startWrittenSince, true},
		{"T14: written while no watcher ran and grown: resumed, the watcher has it compared once quiet",
			with(func(s *startFacts) { s.mtime, s.size = mt+1, off+10 }), true, startCheckpoint, true},
		{"a record without a modification time", with(func(s *startFacts) { s.recMTime, s.mtime = 0, mt }), true, startCheckpoint, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := chooseStart(tc.facts)
			asked := c.needLastLine
			if asked {
				tc.facts.lastLine = answer("", tc.lastLine)
				c = chooseStart(tc.facts)
			}
			if c.needLastLine || c.why != tc.why || asked != tc.asked {
				t.Errorf("why %d asked %v (need %v), want why %d asked %v", c.why, asked, c.needLastLine, tc.why, tc.asked)
			}
		})
	}
}

// TestChoosePast: a file resumed from its checkpoint keeps the frontier only when the
// file still holds what the mirror holds past it.
func TestChoosePast(t *testing.T) {
	type read struct{ short, newer bool }
	for _, tc := range []struct {
		name   string
		behind bool
		read   *read       // what the read past the checkpoint finds, when asked
		cmp    *comparison // how the file past the frontier compares, when asked
		why    pastReason
		asked  []pastNeed
	}{
		{name: "nothing past the checkpoint, the file as it was", read: &read{}, cmp: ptr(sameLength),
			why: pastKept, asked: []pastNeed{pastNeedRead, pastNeedCompare}},
		{name: "lines acknowledged past the checkpoint, still in the file, and more", read: &read{}, cmp: ptr(longer),
			why: pastKept, asked: []pastNeed{pastNeedRead, pastNeedCompare}},
		{name: "the mirror behind the checkpoint (purged, restored): compared whole, nothing read", behind: true,
			why: pastBehind},
		{name: "T25: lines past the frontier stored below the checkpoint's sequence: compared whole", read: &read{short: true},
			why: pastShort, asked: []pastNeed{pastNeedRead}},
		{name: "a generation started after the checkpoint", read: &read{newer: true},
			why: pastNewer, asked: []pastNeed{pastNeedRead}},
		{name: "T7: lines acknowledged past the checkpoint cut back since", read: &read{}, cmp: ptr(shorter),
			why: pastVanished, asked: []pastNeed{pastNeedRead, pastNeedCompare}},
		{name: "lines acknowledged past the checkpoint changed since", read: &read{}, cmp: ptr(differs),
			why: pastVanished, asked: []pastNeed{pastNeedRead, pastNeedCompare}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := pastFacts{behind: tc.behind}
			c, asked := decided(t, f, choosePast, func(c pastChoice) pastNeed { return c.need }, func(f *pastFacts, n pastNeed) {
				switch {
				case n == pastNeedRead && tc.read != nil:
					f.read, f.short, f.newer = true, tc.read.short, tc.read.newer
				case n == pastNeedCompare && tc.cmp != nil:
					f.compared, f.cmp = true, *tc.cmp
				default:
					t.Fatalf("asked %d, which the row does not answer", n)
				}
			})
			if got, want := fmt.Sprint(c.why, asked), fmt.Sprint(tc.why, tc.asked); got != want {
				t.Errorf("why, asked: %s, want %s", got, want)
			}
		})
	}
}

// TestChooseGeneration: a file compared whole with the newest generation is mirrored on
// into it, into a new one, or (a copy of a conversation another host continued) waits
// or diverges.
func TestChooseGeneration(t *testing.T) {
	yes, no := answer("", true), answer("", false)
	// The answers a row gives when asked: the session store writes the generation;
	// another host wrote the line where the file parts from it; the file holds what it
	// had acknowledged; it has lines past them (asked when they are in an older
	// generation).
	type answers struct{ store, writer, intact, own lookup }
	for _, tc := range []struct {
		name  string
		facts genFacts
		answers
		why   genReason
		asked []genNeed
	}{
		{name: "the file holds exactly the generation", facts: genFacts{cmp: sameLength},
			why: genKept},
		{name: "the file holds the generation and lines of its own", facts: genFacts{cmp: longer}, answers: answers{store: no},
			why: genKept, asked: []genNeed{genNeedStore}},
		{name: "a mirrored line this host wrote changed", facts: genFacts{cmp: differs}, answers: answers{writer: no},
			why: genChanged, asked: []genNeed{genNeedWriter}},
		{name: "T7: the file holds fewer lines than the generation it wrote", facts: genFacts{cmp: shorter}, answers: answers{store: no, writer: no},
			why: genChanged, asked: []genNeed{genNeedStore, genNeedWriter}},
		{name: "T25: the generation holds a line twice", facts: genFacts{cmp: sameLength, doubled: true}, answers: answers{store: no},
			why: genTwice, asked: []genNeed{genNeedStore}},
		{name: "T25: a line twice, and the file longer", facts: genFacts{cmp: longer, doubled: true}, answers: answers{store: no},
			why: genTwice, asked: []genNeed{genNeedStore}},
		{name: "a doubled count of a generation that differs anyway", facts: genFacts{cmp: differs, doubled: true}, answers: answers{writer: no},
			why: genChanged, asked: []genNeed{genNeedWriter}},
		{name: "the session store's doubled generation is the store's to write", facts: genFacts{cmp: sameLength, doubled: true}, answers: answers{store: yes},
			why: genKept, asked: []genNeed{genNeedStore}},
		{name: "the session store wrote past the file's lines (DESIGN §8)", facts: genFacts{cmp: shorter}, answers: answers{store: yes},
			why: genKept, asked: []genNeed{genNeedStore}},
		{name: "the store writes it and the file was appended to since the cut-over", facts: genFacts{cmp: longer}, answers: answers{store: yes},
			why: genStore, asked: []genNeed{genNeedStore}},
		{name: "the store wrote where the file has a line of its own (DESIGN §8)", facts: genFacts{cmp: differs},
			answers: answers{writer: yes, intact: yes, store: yes},
			why:     genStore, asked: []genNeed{genNeedWriter, genNeedIntact, genNeedStore}},
		{name: "stored too far out of order to compare", facts: genFacts{cmp: undecided},
			why: genUndecided},
		{name: "failover: another host continued past the file's last line: the file waits", facts: genFacts{cmp: shorter},
			answers: answers{store: no, writer: yes},
			why:     genContinued, asked: []genNeed{genNeedStore, genNeedWriter}},
		{name: "failover: another host continued where the file has lines of its own: diverged", facts: genFacts{cmp: differs},
			answers: answers{writer: yes, intact: yes, store: no},
			why:     genDiverged, asked: []genNeed{genNeedWriter, genNeedIntact, genNeedStore}},
		{name: "a copy of another host's lines with a line made up (recovery's header or placeholder): a new generation",
			facts: genFacts{cmp: differs}, answers: answers{writer: yes, intact: no},
			why: genChanged, asked: []genNeed{genNeedWriter, genNeedIntact}},
		{name: "failover: another host's newer generation, the file has lines past its own: diverged",
			facts:   genFacts{cmp: differs, older: true},
			answers: answers{writer: yes, intact: yes, own: yes, store: no},
			why:     genDiverged, asked: []genNeed{genNeedWriter, genNeedIntact, genNeedOwn, genNeedStore}},
		{name: "failover: another host's newer generation, nothing past the file's own lines: it waits",
			facts:   genFacts{cmp: differs, older: true},
			answers: answers{writer: yes, intact: yes, own: no, store: no},
			why:     genBehind, asked: []genNeed{genNeedWriter, genNeedIntact, genNeedOwn, genNeedStore}},
		{name: "another host's newer generation, the file rewritten below its frontier: a new generation",
			facts: genFacts{cmp: differs, older: true}, answers: answers{writer: yes, intact: no},
			why: genChanged, asked: []genNeed{genNeedWriter, genNeedIntact}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, asked := decided(t, tc.facts, chooseGeneration, func(c genChoice) genNeed { return c.need }, func(g *genFacts, n genNeed) {
				a := map[genNeed]lookup{genNeedStore: tc.store, genNeedWriter: tc.writer, genNeedIntact: tc.intact, genNeedOwn: tc.own}[n]
				if !a.asked {
					t.Fatalf("asked %d, which the row does not answer", n)
				}
				switch n {
				case genNeedStore:
					g.store = a
				case genNeedWriter:
					g.writer = a
				case genNeedIntact:
					g.intact = a
				case genNeedOwn:
					g.own = a
				}
			})
			if got, want := fmt.Sprint(c.why, asked), fmt.Sprint(tc.why, tc.asked); got != want {
				t.Errorf("why, asked: %s, want %s", got, want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// decided runs a decision that asks for facts: it calls choose until need says it waits
// for none, answering each need with answer, and returns the choice and the needs in the
// order they were asked.
func decided[F, C any, N comparable](t *testing.T, f F, choose func(F) C, need func(C) N, answer func(*F, N)) (C, []N) {
	t.Helper()
	var none N
	var asked []N
	for range 8 {
		c := choose(f)
		n := need(c)
		if n == none {
			return c, asked
		}
		asked = append(asked, n)
		answer(&f, n)
	}
	t.Fatalf("still asking after %v", asked)
	panic("unreachable")
}
