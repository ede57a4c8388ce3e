package publisher

import "github.com/pisync/pisync/watcher"

// How Open picks the key a file mirrors under, where it starts reading it and, when it
// asks the mirror (resume), whether the checkpoint's frontier and the newest generation
// still hold: pure decisions over facts Open gathers first (its own maps, the file's
// checkpoint record, the file system, the mirror), each returned with the reason it rests
// on, so that one table holds every case (choose_test.go). A fact that costs something (a
// request to the mirror, a pass over the checkpoint records, a read of the file) or that
// changes something (taking a replaced file's recorded key removes its record) is looked
// up only when the decision needs it: the decision names it (need…), Open looks it up and
// asks again.

// lookup is a fact looked up on demand.
type lookup struct {
	asked bool
	ok    bool
	key   string // the key found, for the lookups that find one
}

// answer is a lookup made: ok, and the key it found if any.
func answer(key string, ok bool) lookup { return lookup{asked: true, ok: ok, key: key} }

// keyFacts is what Open knows of a file when it picks the key the file mirrors under.
type keyFacts struct {
	id string // the conversation id: the header's, or the one an overwritten file keeps (overwrittenID)

	// reopened is the key of the state of the file's identity when the file is that same
	// file opened again, moved or rewritten in place (reopenedKey).
	reopened string
	// replaced is the key of the file of the same session the watcher saw this one
	// replace at its path (retireReplaced).
	replaced string

	// known: this process has a state of the file's identity, not a skipped one.
	known bool
	// record: a checkpoint record under the file's identity; recordHeader: its line 1 is
	// the file's (else the inode number was reused by another file); recordHere: it
	// names the file's root and path; recordKey: the key it holds.
	record, recordHeader, recordHere bool
	recordKey                        string
	// replacedHere: a record of another identity, of this session, names the file's
	// path (replacedAtPath). Asked for a record that names another path.
	replacedHere lookup

	// recorded: a clash key a record of another identity holds for the file's path
	// (recordedClashKey; taking it removes that record).
	recorded lookup
	// previous: a clash key the mirror says the file had (previousClashKey: head reads);
	// previousDiverged: it is the key of the file's copy of a conversation another host
	// continued (its head records the divergence), not a clash.
	previous         lookup
	previousDiverged bool
}

// keyNeed names the fact a key decision waits for.
type keyNeed int

const (
	needNothing keyNeed = iota
	needReplacedHere
	needRecorded
	needPrevious
)

// keyReason says where a key comes from.
type keyReason int

const (
	// keyID: nothing says the file had another key; the conversation id (a contested
	// claim still turns it into a clash key, chooseClaim).
	keyID keyReason = iota
	// keyReopened: the file is its identity's file opened again; it keeps its key.
	keyReopened
	// keyReplaced: a file of its session was seen replaced by it at its path; one path,
	// one key (a clash key stays a clash key, or two keys would name the path).
	keyReplaced
	// keyCheckpoint: the file's checkpoint record holds its key.
	keyCheckpoint
	// keyRecorded: the file replaced one of its session at its path while the daemon did
	// not see it (stopped, or killed before the new file's checkpoint): it keeps the
	// replaced file's clash key, which that file's record holds for the path.
	keyRecorded
	// keyPrevious: without a checkpoint (the state directory lost), the mirror says the
	// file had a clash key: still a clash, reported as when first found.
	keyPrevious
	// keyDiverged: without a checkpoint, the mirror says the file had the key of its copy
	// of a conversation another host continued (failover.go): no clash.
	keyDiverged
)

// keyChoice is a key decision: a fact to look up first (need), or the key and why. What
// it says of the record holds once the record is decided (need is not needReplacedHere).
type keyChoice struct {
	need keyNeed
	key  string
	why  keyReason
	// record: the checkpoint record describes this file, and chooseStart may resume from
	// it. reusedHere: a record that matched the file's identity and line 1 is not its
	// own: the file replaced one of its session at its path while the daemon was
	// stopped, and the record is its former file's, whose inode number it was given.
	record, reusedHere bool
}

// chooseKey picks the key a file mirrors under, before any claim (chooseClaim). In order:
// the key of the file it is (reopened), of the file it replaced at its path, of its
// checkpoint, of the record a replacement the daemon missed left for its path, of the
// mirror's head naming it; else the conversation id.
//
// A record under the file's identity counts only when line 1 is the file's, and, when it
// names another path, only if no record of this session names the file's own path: an
// original and its copy both replaced while the daemon was down, the copy's replacement
// given the original's freed inode number, looks moved from the original's path (line 1
// is the same in a copy); taken as moved, it took the original's key, and the key its
// own path had kept a head naming that path. A file moved over another of its session
// while the daemon was stopped is then keyed as a replacement: its old key's head names
// a path where no file is, nothing is lost.
func chooseKey(k keyFacts) keyChoice {
	record := k.record && k.recordHeader
	elsewhere := record && !k.known && !k.recordHere
	if elsewhere && !k.replacedHere.asked {
		return keyChoice{need: needReplacedHere}
	}
	c := keyChoice{record: record && !(elsewhere && k.replacedHere.ok)}
	c.reusedHere = record && !c.record
	switch {
	case k.reopened != "":
		c.key, c.why = k.reopened, keyReopened
	case k.replaced != "":
		c.key, c.why = k.replaced, keyReplaced
	case c.record && k.recordKey != "":
		c.key, c.why = k.recordKey, keyCheckpoint
	case !k.recorded.asked:
		c.need = needRecorded
	case k.recorded.ok:
		c.key, c.why = k.recorded.key, keyRecorded
	case !k.previous.asked:
		c.need = needPrevious
	case k.previous.ok && k.previousDiverged:
		c.key, c.why = k.previous.key, keyDiverged
	case k.previous.ok:
		c.key, c.why = k.previous.key, keyPrevious
	default:
		c.key, c.why = k.id, keyID
	}
	return c
}

// claimFacts is what claimKey knows, under the publisher's lock, of the file that holds
// the key a file claims.
type claimFacts struct {
	taken bool // a file holds the key
	self  bool // the file claiming it
	// openingIt: the holder's identity is inside an Open that claimed this very key (its
	// state is registered only at the end of Open).
	openingIt bool
	// stateHolds: the holder's registered state carries the key, and is neither gone nor
	// skipped.
	stateHolds bool
	// vanished: the holder's file is no longer at its path, or its inode number now
	// belongs to another file (vanished). Asked when stateHolds.
	vanished lookup
}

// claimReason says how a claim of a key ends.
type claimReason int

const (
	claimFree    claimReason = iota // no file holds the key
	claimOwn                        // the file claiming it holds it
	claimStale                      // its holder no longer carries it: the claim passes
	claimOpening                    // an Open in progress claimed it: the claimant derives a key
	claimLive                       // a live file carries it: the claimant derives a key
)

// claimChoice is a claim decision: look up whether the holder vanished first, or whether
// the key is the claimant's and why.
type claimChoice struct {
	needVanished bool
	take         bool // the key is the claimant's; else it mirrors under contestedKey
	why          claimReason
}

// chooseClaim decides a claim of a key. An Open in progress holds only the key it
// claimed itself: a claim left under its inode number by the file that number belonged
// to before (inode numbers are reused at once after a rewrite by rename) is judged by
// that file's registered state, else a rewrite lost its key to an Open of another
// session. A registered state's claim is stale once its file left its path: the
// watcher reports Gone only after a grace period.
func chooseClaim(c claimFacts) claimChoice {
	switch {
	case !c.taken:
		return claimChoice{take: true, why: claimFree}
	case c.self:
		return claimChoice{take: true, why: claimOwn}
	case c.openingIt:
		return claimChoice{why: claimOpening}
	case !c.stateHolds:
		return claimChoice{take: true, why: claimStale}
	case !c.vanished.asked:
		return claimChoice{needVanished: true}
	case c.vanished.ok:
		return claimChoice{take: true, why: claimStale}
	}
	return claimChoice{why: claimLive}
}

// contestedKey is the key a file of conversation id mirrors under when a live file holds
// the key it claimed: the one derived from the id and the file's path, also when the key
// contested is a clash key (one a moved file kept, or another file was given for its
// lines). A key derived from a clash key is found again by no start without state
// (previousClashKey and movedClashKey look at the id's own clash keys): the file then
// took another key while the old one's head kept naming its path. Only a file whose own
// derived key is contested (its path's former file moved and kept it) derives from that.
func contestedKey(id, key string, f watcher.File) string {
	if alt := clashKey(id, f); alt != key {
		return alt
	}
	return clashKey(key, f)
}

// startFacts is what Open knows when it decides where to start reading a file.
type startFacts struct {
	record bool // the checkpoint record describes the file (keyChoice.record)
	why    watcher.OpenReason
	// What the record says: deleted, its frontier (offset), a change whose settled check
	// was pending (unsettled), the file's modification time when last known to match
	// (recMTime, 0: unknown).
	deleted   bool
	offset    int64
	unsettled bool
	recMTime  int64
	// The file as the watcher announced it.
	size, mtime int64
	// lastLine: the record's last acknowledged line is still where it says
	// (verifyLastLine). Asked when nothing else has decided.
	lastLine lookup
}

// startReason says why a file is read from where it is.
type startReason int

const (
	startCheckpoint   startReason = iota // from the record's frontier
	startNoRecord                        // no record describes the file: from its start, compared with the mirror
	startRewritten                       // reopened after a rewrite: the frontier proves nothing about the lines before it
	startDeleted                         // the record is of the file deleted
	startShorter                         // the file ends before the frontier
	startChanged                         // the record's last line is not where it says: the file changed under it
	startUnsettled                       // stopped while the settled check of a change was pending
	startWrittenSince                    // written while no watcher ran, ending where the record says
)

// startChoice is a start decision: read the record's last line first, or where to start
// and why. Any start but startCheckpoint compares the whole file with the mirror.
type startChoice struct {
	needLastLine bool
	why          startReason
}

// chooseStart decides whether a file resumes from its checkpoint record's frontier or is
// compared whole with the mirror. The frontier is trusted only for a file seen anew (a
// start, a move) whose record's last line is still in place, with two exceptions, two
// rewrites that keep the last line: the daemon stopped while the watcher's settled check
// of a change was pending (it alone finds a rewrite that keeps header, size and last
// line), and a file written while no watcher ran that ends where the record says (an
// earlier line rewritten at the same size; a file that grew is resumed, and the watcher
// has it compared, Rechecked, once it is quiet).
func chooseStart(s startFacts) startChoice {
	switch {
	case !s.record:
		return startChoice{why: startNoRecord}
	case s.why == watcher.Truncated || s.why == watcher.Replaced || s.why == watcher.Rechecked:
		return startChoice{why: startRewritten}
	case s.deleted:
		return startChoice{why: startDeleted}
	case s.size < s.offset:
		return startChoice{why: startShorter}
	case !s.lastLine.asked:
		return startChoice{needLastLine: true}
	case !s.lastLine.ok:
		return startChoice{why: startChanged}
	case s.unsettled:
		return startChoice{why: startUnsettled}
	case s.recMTime != 0 && s.recMTime != s.mtime && s.size == s.offset:
		return startChoice{why: startWrittenSince}
	}
	return startChoice{why: startCheckpoint}
}

// pastFacts is what a resume from a checkpoint has learnt of the mirror past the
// checkpoint's frontier.
type pastFacts struct {
	behind bool // the mirror holds less than the checkpoint acknowledged (purged, restored from an older backup)
	// read: what the mirror holds past the checkpoint was read (heldPast); short: fewer
	// messages from the checkpoint's sequence on than the stream's leader counts past it;
	// newer: a newer generation is among them.
	read, short, newer bool
	// compared: the file from the frontier on was compared with those lines (cmp).
	compared bool
	cmp      comparison
}

// pastNeed names the fact a resume from a checkpoint waits for.
type pastNeed int

const (
	pastNeedNothing pastNeed = iota
	pastNeedRead             // read what the mirror holds past the checkpoint
	pastNeedCompare          // compare the file past the frontier with it
)

// pastReason says whether a resume keeps the checkpoint's frontier, and why not.
type pastReason int

const (
	pastKept     pastReason = iota // the file holds every line past the frontier the mirror holds
	pastBehind                     // the mirror is behind the checkpoint: the whole file is compared
	pastShort                      // lines past the frontier were stored below the checkpoint's sequence
	pastNewer                      // a generation started after the checkpoint: its generation is over
	pastVanished                   // the file does not hold what the mirror holds past the checkpoint: changed here, or another host's copy went on
)

type pastChoice struct {
	need pastNeed
	why  pastReason
}

// choosePast decides whether a file resumed from its checkpoint keeps the frontier or is
// compared whole with the mirror. Lines the mirror holds past the frontier were published
// by a daemon that died before committing them; they must still be in the file, else it
// was cut back since (a new generation, which the whole comparison starts; it also tells
// those lines from lines the session store wrote). A read from the checkpoint's sequence
// that finds fewer messages than the leader counts past the checkpoint misses lines
// stored before that sequence (a line below the frontier stored late, a repeated entry id
// or a reconciliation's resend): they would be sent again, and stored twice once the
// duplicate window has passed.
func choosePast(f pastFacts) pastChoice {
	switch {
	case f.behind:
		return pastChoice{why: pastBehind}
	case !f.read:
		return pastChoice{need: pastNeedRead}
	case f.short:
		return pastChoice{why: pastShort}
	case f.newer:
		return pastChoice{why: pastNewer}
	case !f.compared:
		return pastChoice{need: pastNeedCompare}
	case f.cmp == sameLength || f.cmp == longer:
		return pastChoice{why: pastKept}
	}
	return pastChoice{why: pastVanished}
}

// genFacts is what a resume that compared the whole file with the newest generation
// knows: how they compare, whether the generation holds an ordinal more than once, and
// (asked when the file and the generation differ in length, or the generation is
// doubled) whether the session store writes that generation.
//
// Where the file and the generation part (the file differs, or ends first), the rest is
// asked in turn, each only if the answer before leaves it open: whether another host
// wrote the generation's line there (writer), whether the file still holds every line
// it had acknowledged under this key (intact), and, when those are in an older
// generation than the newest (older), whether it has lines of its own past them (own).
type genFacts struct {
	cmp     comparison
	doubled bool
	store   lookup
	older   bool
	writer  lookup
	intact  lookup
	own     lookup
}

// genNeed names the fact a generation decision waits for.
type genNeed int

const (
	genNeedNothing genNeed = iota
	genNeedStore
	genNeedWriter
	genNeedIntact
	genNeedOwn
)

// genReason says whether the newest generation is kept, and why a new one starts.
type genReason int

const (
	genKept      genReason = iota // the file holds the generation's lines (and perhaps more of its own)
	genChanged                    // a mirrored line changed or vanished locally
	genTwice                      // the generation holds a line twice
	genStore                      // the session store writes it and the file was appended to since
	genUndecided                  // stored too far out of order to compare in bounded memory
	// genContinued: another host continued the generation past the file's last line: the
	// file is kept on it and publishes nothing; a line it gets later diverges.
	genContinued
	// genBehind: another host started a newer generation after the file's (its copy was
	// not this file's lines), and the file has no line past its acknowledged ones: it
	// stays at its frontier and publishes nothing; a line it gets later diverges.
	genBehind
	// genDiverged: another host continued the conversation past the lines the file
	// shares with it, and the file has lines of its own there: it is mirrored whole
	// under its diverged key (failover.go).
	genDiverged
)

type genChoice struct {
	need genNeed
	why  genReason
}

// chooseGeneration decides whether a file compared whole with the newest generation is
// mirrored on into it or into a new one. One writer at a time (DESIGN §8): a generation
// the session store writes is kept only by a file that holds exactly its lines so far
// (the store wrote after them); a file with lines of its own past them was appended to
// locally since the cut-over. A generation holding a line twice is not kept (the
// comparison reads the first copy of each line and finds the file equal: the second
// copies would stay for good), unless it is the store's to write.
//
// A file that parts from the generation at a line this host wrote was changed here: a
// new generation. At a line another host wrote, it is a copy the other host continued
// (failover): a prefix waits, publishing nothing; a copy with lines of its own past what
// it had acknowledged diverges, unless the other writer is the session store (its head
// says so), whose generation the file's lines leave as before. A file that does not hold
// what it had acknowledged (rewritten here since) is changed whoever wrote on, and so is
// one whose past the daemon does not know (no checkpoint) when the lines it shares with
// the generation are another host's: a copy rebuilt by recovery with a made-up header or
// placeholder is not the conversation's lines, and starts a new generation.
func chooseGeneration(g genFacts) genChoice {
	doubled := (g.cmp == sameLength || g.cmp == longer) && g.doubled
	if (g.cmp == longer || g.cmp == shorter || doubled) && !g.store.asked {
		return genChoice{need: genNeedStore}
	}
	store := g.store.ok
	twice := doubled && !store
	switch {
	case !twice && (g.cmp == sameLength || g.cmp == longer && !store || g.cmp == shorter && store):
		return genChoice{why: genKept}
	case twice:
		return genChoice{why: genTwice}
	case store:
		return genChoice{why: genStore}
	case g.cmp == undecided:
		return genChoice{why: genUndecided}
	case !g.writer.asked:
		return genChoice{need: genNeedWriter}
	case !g.writer.ok:
		return genChoice{why: genChanged}
	case g.cmp == shorter:
		return genChoice{why: genContinued}
	case !g.intact.asked:
		return genChoice{need: genNeedIntact}
	case !g.intact.ok:
		return genChoice{why: genChanged}
	case g.older && !g.own.asked:
		return genChoice{need: genNeedOwn}
	case !g.store.asked:
		return genChoice{need: genNeedStore}
	case g.older && !g.own.ok:
		return genChoice{why: genBehind}
	}
	return genChoice{why: genDiverged}
}
