package mirror

import (
	"fmt"
	"strconv"
	"strings"
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

// NewMsg builds the message of one line of conversation c, with its headers as a map
// (the session store's writes; the publisher sends NewOutgoing's encoded form). body is
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

// headerList is the headers of one line in the order NewOutgoing writes them.
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

// Outgoing is the message of one line as the publisher sends it: its header block
// encoded once and the line's bytes, in one buffer, with the line's metadata beside them,
// so that no header map is built or walked per line (a map of a dozen headers, filled and
// then encoded by nats.go, was a tenth of the daemon's CPU: bench/RESULTS.md, issue 15).
// It does not change once built: a publish in flight may still read it.
type Outgoing struct {
	Subject string
	Line    Line
	Data    []byte // the line's bytes; nil for a blob reference
	hdr     []byte // the header block, ending in its blank line
	buf     *[]byte
}

// NewOutgoing builds the message of one line of conversation c, as NewMsg but with its
// headers encoded as nats.go encodes NewMsg's. body is copied: the caller may reuse it.
func (n Names) NewOutgoing(c Conv, l Line, body []byte) *Outgoing {
	subject, hs := n.headers(c, l)
	size := len(hdrLine) + len(crlf)
	for _, kv := range hs.kv[:hs.n] {
		size += len(kv[0]) + len(kv[1]) + 4
	}
	buf := lineBuffers.get(size + len(body))
	b := append((*buf)[:0], hdrLine...)
	for _, kv := range hs.kv[:hs.n] {
		b = appendHeaderLine(b, kv[0], kv[1])
	}
	b = append(b, crlf...)
	h := len(b)
	b = append(b, body...)
	*buf = b
	o := &Outgoing{Subject: subject, Line: l, hdr: b[:h:h], buf: buf}
	if len(body) > 0 {
		o.Data = b[h:len(b):len(b)]
	}
	return o
}

// Release hands o's buffer back for another line's message. The caller must be sure that
// nothing reads o any more: every publish of it is resolved (a publish's record holds
// its bytes until then) and o is dropped.
func (o *Outgoing) Release() {
	if o.buf != nil {
		lineBuffers.put(o.buf)
	}
	*o = Outgoing{}
}

// Header is the header block to send: o's, with fence (a stream sequence) as the
// expected last sequence of its subject when not "". The returned bytes are never
// written again.
func (o *Outgoing) Header(fence string) []byte {
	if fence == "" {
		return o.hdr
	}
	b := make([]byte, 0, len(o.hdr)+len(fenceKey)+len(fence)+len(": \r\n"))
	b = append(b, o.hdr[:len(o.hdr)-len(crlf)]...)
	b = appendHeaderLine(b, fenceKey, fence)
	return append(b, crlf...)
}

// Msg is o as a message with a header map, fenced as Header is.
func (o *Outgoing) Msg(fence string) *nats.Msg {
	h, err := nats.DecodeHeadersMsg(o.Header(fence))
	if err != nil {
		panic(fmt.Sprintf("mirror: decode a header block built here: %v", err)) // a bug in appendHeaderLine
	}
	return &nats.Msg{Subject: o.Subject, Header: h, Data: o.Data}
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
}
