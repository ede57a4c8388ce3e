package publisher

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// fileState is what the publisher knows of one session file. Its mutex guards every field
// that changes once the state is registered; file, conv, id, cwd, format, hdrSum,
// skipped, liveFrom, headerAt and diverged never change once it is built and are read
// without it (locksordering.txt: the order of the publisher's mutexes).
//
// There is one per session file, idle or not (100,000 on a big host), so it holds only
// what publishing and the checkpoint and head records need: the header's id, cwd and
// format rather than the parsed header, its digest as bytes, the frontier without the
// strings a checkpoint record repeats.
type fileState struct {
	mu sync.Mutex

	file    watcher.File // Header dropped: the watcher has it, and only Open reads it
	conv    mirror.Conv
	id      string // the header's id (the conversation)
	cwd     string
	format  session.Format
	hdrSum  [sha256.Size]byte // digest of line 1
	skipped bool              // not a session
	gone    bool              // deleted locally
	// The booleans of the groups below sit here, with these, so that no padding takes the
	// struct over a size class of the allocator (TestFileStateSize).
	cpDirty         bool
	headDirty       bool
	goneHeadWritten bool // a head saying the file is deleted locally is in the mirror
	takenOver       bool // another writer extended acked.Generation: the file waits to be reopened (one writer, below)
	unsettled       bool // lines delivered since a change the watcher's settled check has yet to confirm
	// ownAck: a line this daemon published from the file was acknowledged since the file
	// was opened or last reconciled. The back-fill's lines after that go unfenced (fence).
	ownAck bool

	// acked is the acknowledged frontier: everything before acked.Offset is in the mirror.
	acked frontier
	leaf  session.Leaf

	queue []*item     // lines read past the frontier, in file order, not yet resolved
	held  *heldWindow // what the mirror already holds past the frontier (resume protocol, held.go)

	failed    bool          // a publish failed: queue must be reconciled with the mirror
	pressured bool          // it failed for lack of room in the cluster: retried at the gate
	retry     *retryBackoff // pauses between reconciliations, reset by an acknowledgement
	resyncing chan struct{} // closed when a running reconciliation ends
	torn      int64         // bytes of a torn tail held by the watcher
	seenEnd   int64         // end of the last line read
	mtime     int64         // the file's modification time when last compared or checked whole (see Settled)
	// headerAt is the ordinal of the header line: 0 in Pi's files, later after records
	// a fork writes first (a title), -1 in a file without one (session.Lead).
	headerAt int
	headSeq  uint64 // acked.StreamSeq of the last head written (kept in the checkpoint)
	// recordedHeadSeq is headSeq as of the last checkpoint record staged.
	recordedHeadSeq uint64

	// One writer at a time (DESIGN §8, onewriter.go; and takenOver above).
	storeGen int    // the generation the session store writes (0: none known)
	fenceSeq uint64 // newest sequence of the conversation's subject known besides acked.StreamSeq
	// liveFrom is the file's size when it was opened. Lines ending past it are appends
	// made since: each is sent once the one before it is acknowledged, fenced on it
	// (onewriter.go). The lines the file held when opened (a back-fill) are pipelined,
	// however often the queue drains while the watcher reads them.
	liveFrom int64
	// diverged: conv is the key of this host's copy of a conversation another host
	// continued past their shared lines (failover.go); nil for any other key.
	diverged *mirror.Divergence
}

// item is one line past the frontier.
type item struct {
	ordinal  int64
	end      int64 // offset after the newline
	length   int64
	sha      string
	env      session.Envelope
	entry    bool // env is valid (the leaf rule applies)
	kind     mirror.Kind
	out      *mirror.Outgoing // kept until acknowledged, so a retry resends the same bytes and id
	sends    int              // publishes of out: its buffer is reused only after the one of a single publish
	seen     time.Time
	weight   int64 // bytes taken from the window
	done     bool
	seq      uint64
	inFlight bool
	reblob   bool // refused whole by the server: being sent the blob way
	dropped  bool // quarantined: refused for good, the frontier passes it unmirrored
	slot     bool // holds one of the window's message slots until resolved
	waiting  bool // a live line queued behind an unresolved one: sent when it resolves
}

// frontier is the acknowledged position in a file: the numbers of a checkpoint.Record,
// whose other fields record() fills from the file's state.
type frontier struct {
	Generation int
	Base       uint64 // messages of older generations in the subject (checkpoint.Record.GenBase)
	Offset     int64  // byte offset after the last acknowledged line
	Ordinal    int64  // ordinal of the next line
	StreamSeq  uint64
	LastSHA    string // digest of the last acknowledged line
	LastLen    int64
	Entries    int64
	Bytes      int64
}

// divergenceOf is the divergence r records, nil for none.
func divergenceOf(r checkpoint.Record) *mirror.Divergence {
	if r.DivergedKey == "" {
		return nil
	}
	return &mirror.Divergence{Key: r.DivergedKey, Generation: r.DivergedGen, Ordinal: r.DivergedOrdinal, Host: r.DivergedHost}
}

func frontierOf(r checkpoint.Record) frontier {
	return frontier{Generation: r.Generation, Base: r.GenBase, Offset: r.Offset, Ordinal: r.Ordinal, StreamSeq: r.StreamSeq,
		LastSHA: r.LastSHA, LastLen: r.LastLen, Entries: r.Entries, Bytes: r.Bytes}
}

func (st *fileState) record() checkpoint.Record {
	a := st.acked
	r := checkpoint.Record{
		Dev: st.file.ID.Dev, Ino: st.file.ID.Ino,
		HeaderSHA:    session.HexDigest(st.hdrSum),
		Root:         st.file.Root,
		Rel:          st.file.Rel,
		Conversation: st.id,
		ConvKey:      st.conv.Key,
		Format:       string(st.format),
		Cwd:          st.cwd,
		Generation:   a.Generation,
		GenBase:      a.Base,
		Offset:       a.Offset,
		Ordinal:      a.Ordinal,
		StreamSeq:    a.StreamSeq,
		LastSHA:      a.LastSHA,
		LastLen:      a.LastLen,
		Leaf:         st.leaf.ID(),
		Entries:      a.Entries,
		Bytes:        a.Bytes,
		Deleted:      st.gone,
		Unsettled:    st.unsettled,
		MTime:        st.mtime,
		HeadSeq:      st.headSeq,
		UpdatedAt:    time.Now().UTC(),
	}
	if d := st.diverged; d != nil {
		r.DivergedKey, r.DivergedGen, r.DivergedOrdinal, r.DivergedHost = d.Key, d.Generation, d.Ordinal, d.Host
	}
	return r
}

func (st *fileState) head(host string) mirror.Head {
	return mirror.Head{
		Conversation: st.id,
		Key:          st.conv.Key,
		Tenant:       st.conv.Owner.Tenant,
		Owner:        st.conv.Owner.Name,
		Host:         host,
		Root:         st.file.Root,
		Source:       st.file.Rel,
		Cwd:          st.cwd,
		Format:       string(st.format),
		Generation:   st.acked.Generation,
		Entries:      st.acked.Entries,
		LastOrdinal:  st.acked.Ordinal - 1,
		LastSeq:      st.acked.StreamSeq,
		Bytes:        st.acked.Bytes,
		Head:         st.leaf.ID(),
		LocalDeleted: st.gone,
		Headerless:   st.headerAt < 0,
		UpdatedAt:    time.Now().UTC(),
		DivergedFrom: st.diverged,
	}
}

// advance moves the frontier over the resolved lines at the head of the queue and
// returns the window weight they release.
func (st *fileState) advance() (released int64, n int) {
	for len(st.queue) > 0 && st.queue[0].done {
		it := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		st.acked.Offset = it.end
		st.acked.Ordinal = it.ordinal + 1
		if it.seq > st.acked.StreamSeq {
			st.acked.StreamSeq = it.seq
		}
		st.acked.LastSHA = it.sha
		st.acked.LastLen = it.length
		if !it.dropped {
			st.acked.Entries++
		}
		st.acked.Bytes = it.end
		if it.entry {
			st.leaf.Apply(it.env)
		}
		released += it.weight
		n++
		st.cpDirty, st.headDirty = true, true
	}
	if len(st.queue) == 0 {
		st.queue = nil
	}
	return released, n
}

// live reports whether it was appended after the file was opened (see liveFrom).
func (st *fileState) live(it *item) bool { return it.end > st.liveFrom }

// oldestSeen is when the oldest unresolved line was read.
func (st *fileState) oldestSeen() time.Time {
	if len(st.queue) == 0 {
		return time.Time{}
	}
	return st.queue[0].seen
}

// setOut gives it a new message, not yet sent. The caller holds st.mu, or owns it alone.
func (it *item) setOut(out *mirror.Outgoing) {
	it.out, it.sends = out, 0
}
