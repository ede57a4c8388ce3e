package mirror

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	BlobSize   int64 // KindBlob only
}

// NewMsg builds the message of one line of conversation c. body is the line's exact
// bytes without its newline (empty for a blob reference).
//
// It runs once per line, so it allocates little: the subject, message id, ordinal,
// generation and blob size are cut out of one string (the message id follows the
// subject's owner and conversation tokens in it), the message and the backing array of
// every header value are one object, and the header map the last (a map entry's
// []string of its own would be a dozen allocations per line) unless RecycleHeader handed
// one back.
func (n Names) NewMsg(c Conv, l Line, body []byte) *nats.Msg {
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

	m := &msgWithValues{}
	h, _ := headerMaps.Get().(nats.Header)
	if h == nil {
		h = make(nats.Header, 12)
	}
	k := 0
	set := func(key, v string) {
		m.vals[k] = v
		h[key] = m.vals[k : k+1 : k+1]
		k++
	}
	set(HdrMsgID, s[idStart:idEnd])
	set(HdrKind, string(l.Kind))
	set(HdrEntryID, l.EntryID)
	if l.ParentID != "" {
		set(HdrParentID, l.ParentID)
	}
	if l.EntryType != "" {
		set(HdrEntryType, l.EntryType)
	}
	set(HdrOrdinal, s[idEnd:ordEnd])
	set(HdrGeneration, gen)
	set(HdrSHA256, l.SHA256)
	set(HdrFormat, l.Format)
	set(HdrHost, l.Host)
	set(HdrSource, l.Source)
	if l.Kind == KindBlob {
		set(HdrBlobSize, s[ordEnd:])
	}
	m.msg = nats.Msg{Subject: s[:subjEnd], Header: h, Data: body}
	return &m.msg
}

// headerMaps holds the header maps RecycleHeader got back, empty. A map of a dozen
// headers is four allocations and half of NewMsg's time (bench/RESULTS.md, issue 15).
var headerMaps sync.Pool

// RecycleHeader takes back the header map of m, a message NewMsg built, for another
// message; m is left without headers. The caller must be sure nothing reads m's headers
// again: it published m once and holds the server's acknowledgement of that publish
// (nats.go keeps a message only until then, for its own retries), and it drops m.
func RecycleHeader(m *nats.Msg) {
	h := m.Header
	m.Header = nil
	if h == nil {
		return
	}
	clear(h)
	headerMaps.Put(h)
}

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
