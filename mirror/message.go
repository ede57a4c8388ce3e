package mirror

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Header names of a mirrored line (DESIGN §2).
const (
	HdrMsgID      = nats.MsgIdHdr // "Nats-Msg-Id"
	HdrKind       = "Pisync-Kind"
	HdrEntryID    = "Pisync-Entry-Id"
	HdrParentID   = "Pisync-Parent-Id"
	HdrEntryType  = "Pisync-Entry-Type"
	HdrOrdinal    = "Pisync-Ordinal"
	HdrGeneration = "Pisync-Generation"
	HdrSHA256     = "Pisync-Sha256"
	HdrFormat     = "Pisync-Format"
	HdrHost       = "Pisync-Host"
	HdrSource     = "Pisync-Source"
	HdrBlobSize   = "Pisync-Blob-Size" // blob messages only: the payload's length
	// HdrFork is set by the session store on the header of a fork: what the fork copies,
	// so that a fork not yet complete can be told apart and resumed (docs/store-protocol.md).
	HdrFork = "Pisync-Fork"
)

// Kind says how a message carries its line.
type Kind string

// The kinds of DESIGN §2.
const (
	KindHeader Kind = "header" // line 1
	KindEntry  Kind = "entry"  // a JSON entry, body = the line
	KindBlob   Kind = "blob"   // body empty; the line is the object named by its digest
	KindRaw    Kind = "raw"    // not a JSON entry: kept byte for byte, never interpreted
)

// HeaderEntryType is the Pisync-Entry-Type (and entry id) of line 1.
const HeaderEntryType = "_header"

// OrdinalID is the entry id of lines that have none (v1 entries, raw lines).
func OrdinalID(ordinal int64) string { return "L" + strconv.FormatInt(ordinal, 10) }

// Line is the metadata of one mirrored line: everything of a message but its body.
type Line struct {
	Kind       Kind
	EntryID    string
	ParentID   string
	EntryType  string
	Ordinal    int64
	Generation int
	SHA256     string // hex digest of the line's bytes
	Format     string
	Host       string
	Source     string
	BlobSize   int64  // KindBlob only
	Fork       string // HdrFork of a fork's header, as written; read back by ParseLine only
}

// OwnEntryID is the entry id the line carries itself: "" for a line stored under its
// ordinal (OrdinalID), which has none.
func (l Line) OwnEntryID() string {
	if l.EntryID == OrdinalID(l.Ordinal) {
		return ""
	}
	return l.EntryID
}

// NewMsg builds the message of one line of conversation c, with its headers as a map
// (the session store's writes; the publisher sends NewOutgoing's pooled form). body is
// the line's exact bytes without its newline (empty for a blob reference).
//
// The message and the backing array of every header value are one object (a map
// entry's []string of its own would be a dozen allocations).
func (n Names) NewMsg(c Conv, l Line, body []byte) *nats.Msg {
	subject, hs := n.headers(c, l)
	m := &msgWithValues{}
	h := make(nats.Header, hs.n)
	for k, kv := range hs.kv[:hs.n] {
		m.vals[k] = kv[1]
		h[kv[0]] = m.vals[k : k+1 : k+1]
	}
	m.msg = nats.Msg{Subject: subject, Header: h, Data: body}
	return &m.msg
}

// headerList is the headers of one line.
type headerList struct {
	kv [12][2]string
	n  int
}

func (hs *headerList) add(key, v string) {
	hs.kv[hs.n] = [2]string{key, v}
	hs.n++
}

// headers returns the subject and the headers of l's message in c. It runs once per
// line, so the subject, message id, ordinal, generation and blob size are cut out of
// one string (the message id follows the subject's owner and conversation tokens in it).
func (n Names) headers(c Conv, l Line) (string, headerList) {
	var buf [256]byte
	b := append(buf[:0], n.lower...)
	b = append(b, ".entries."...)
	idStart := len(b)
	b = c.appendPath(b)
	subjEnd := len(b)
	b = appendIDTail(b, l.Generation, l.EntryID)
	idEnd := len(b)
	b = strconv.AppendInt(b, l.Ordinal, 10)
	ordEnd := len(b)
	if l.Kind == KindBlob {
		b = strconv.AppendInt(b, l.BlobSize, 10)
	}
	s := string(b)
	// The generation is the message id's token after the subject's: ".<generation>.<id>".
	gen := s[subjEnd+1 : subjEnd+1+strings.IndexByte(s[subjEnd+1:], '.')]

	var hs headerList
	hs.add(HdrMsgID, s[idStart:idEnd])
	hs.add(HdrKind, string(l.Kind))
	hs.add(HdrEntryID, l.EntryID)
	if l.ParentID != "" {
		hs.add(HdrParentID, l.ParentID)
	}
	if l.EntryType != "" {
		hs.add(HdrEntryType, l.EntryType)
	}
	hs.add(HdrOrdinal, s[idEnd:ordEnd])
	hs.add(HdrGeneration, gen)
	hs.add(HdrSHA256, l.SHA256)
	hs.add(HdrFormat, l.Format)
	hs.add(HdrHost, l.Host)
	hs.add(HdrSource, l.Source)
	if l.Kind == KindBlob {
		hs.add(HdrBlobSize, s[ordEnd:])
	}
	return s[:subjEnd], hs
}

// Outgoing is the message of one line as the publisher sends it, with the line's
// metadata beside it. Its message, header map and the map's values come from a pool and
// go back to it once the line is acknowledged (Release): the map is built for the first
// line a window slot carries and refilled for the next, so a line costs no map of its
// own (filling a fresh map of a dozen headers per line was the largest allocation of a
// back-fill: bench/RESULTS.md). It does not change once built: a publish in
// flight may still read it.
type Outgoing struct {
	Subject string
	Line    Line
	Data    []byte // the line's bytes; nil for a blob reference
	m       *outMsg
	buf     *[]byte
}

// outMsg is a message, its header map and the values the map holds, kept together for
// reuse by the next line.
type outMsg struct {
	msg  nats.Msg
	vals [12]string
}

var outMsgs = sync.Pool{New: func() any {
	m := &outMsg{}
	m.msg.Header = make(nats.Header, len(m.vals)+1) // room for a fence without growing
	return m
}}

// NewOutgoing builds the message of one line of conversation c, with the headers of
// NewMsg. body is copied: the caller may reuse it.
func (n Names) NewOutgoing(c Conv, l Line, body []byte) *Outgoing {
	subject, hs := n.headers(c, l)
	m := outMsgs.Get().(*outMsg)
	h := m.msg.Header
	clear(h)
	for k, kv := range hs.kv[:hs.n] {
		m.vals[k] = kv[1]
		h[kv[0]] = m.vals[k : k+1 : k+1]
	}
	o := &Outgoing{Subject: subject, Line: l, m: m}
	if len(body) > 0 {
		buf := lineBuffers.get(len(body))
		*buf = append((*buf)[:0], body...)
		o.buf, o.Data = buf, *buf
	}
	m.msg = nats.Msg{Subject: subject, Header: h, Data: o.Data}
	return o
}

// Release hands o's message and buffer back for another line. The caller must be sure
// that nothing reads o any more: every publish of it is resolved (a publish's record
// holds its message until then) and o is dropped.
func (o *Outgoing) Release() {
	if o.buf != nil {
		lineBuffers.put(o.buf)
	}
	if o.m != nil {
		clear(o.m.vals[:])
		o.m.msg = nats.Msg{Header: o.m.msg.Header}
		outMsgs.Put(o.m)
	}
	*o = Outgoing{}
}

// Msg is the message to send: o's, or, with fence (a stream sequence) not "", a copy
// whose headers also name it as the expected last sequence of its subject. o's own
// message never changes, so a publish of it still in flight (a retry after "no
// responders") never sees a later send's fence.
func (o *Outgoing) Msg(fence string) *nats.Msg {
	if fence == "" {
		return &o.m.msg
	}
	h := make(nats.Header, len(o.m.msg.Header)+1)
	maps.Copy(h, o.m.msg.Header)
	h[fenceKey] = []string{fence}
	return &nats.Msg{Subject: o.Subject, Header: h, Data: o.Data}
}

// HeaderSize is the size of the header block nats.go sends for o's message unfenced.
func (o *Outgoing) HeaderSize() int {
	m := &o.m.msg
	return m.Size() - len(m.Subject) - len(m.Reply) - len(m.Data)
}

// fenceKey is the header that makes the server refuse a line if its subject's last
// message is not the one expected (DESIGN §8).
const fenceKey = jetstream.ExpectedLastSubjSeqHeader

// msgWithValues is a message and the values of its headers, allocated together.
type msgWithValues struct {
	msg  nats.Msg
	vals [12]string
}

// ParseLine reads the metadata of a mirrored message. It fails on a message that is not
// one of ours (missing or malformed kind, ordinal or generation).
func ParseLine(h nats.Header) (Line, error) {
	l := Line{
		Kind:      Kind(h.Get(HdrKind)),
		EntryID:   h.Get(HdrEntryID),
		ParentID:  h.Get(HdrParentID),
		EntryType: h.Get(HdrEntryType),
		SHA256:    h.Get(HdrSHA256),
		Format:    h.Get(HdrFormat),
		Host:      h.Get(HdrHost),
		Source:    h.Get(HdrSource),
		Fork:      h.Get(HdrFork),
	}
	switch l.Kind {
	case KindHeader, KindEntry, KindBlob, KindRaw:
	default:
		return Line{}, fmt.Errorf("%s %q: not a pisync kind", HdrKind, l.Kind)
	}
	var err error
	if l.Ordinal, err = strconv.ParseInt(h.Get(HdrOrdinal), 10, 64); err != nil || l.Ordinal < 0 {
		return Line{}, fmt.Errorf("%s %q: not an ordinal", HdrOrdinal, h.Get(HdrOrdinal))
	}
	if l.Generation, err = strconv.Atoi(h.Get(HdrGeneration)); err != nil || l.Generation < 1 {
		return Line{}, fmt.Errorf("%s %q: not a generation", HdrGeneration, h.Get(HdrGeneration))
	}
	if l.Kind == KindBlob {
		if l.BlobSize, err = strconv.ParseInt(h.Get(HdrBlobSize), 10, 64); err != nil || l.BlobSize < 0 {
			return Line{}, fmt.Errorf("%s %q: not a size", HdrBlobSize, h.Get(HdrBlobSize))
		}
	}
	return l, nil
}

// Msg is one message read back from the mirror.
type Msg struct {
	Line
	MsgID string    // the Nats-Msg-Id it was published with
	Seq   uint64    // stream sequence
	Time  time.Time // stored at
	Data  []byte    // the line (nil for blobs and for headers-only reads)
	Size  int64     // the line's length without its newline, also in a headers-only read
}
