package mirror

import (
	"net/textproto"
	"strings"
	_ "unsafe" // go:linkname

	"github.com/nats-io/nats.go"
)

// The header block's framing (ADR-4), as nats.go writes it.
const (
	hdrLine = "NATS/1.0\r\n"
	crlf    = "\r\n"
)

// publishEncoded sends m with hdr, a header block built by appendHeaderLine, in place of
// m's header map.
//
// nats.go takes headers only as a map, which it encodes on every publish: filling a map
// of a dozen headers per line and nats.go walking it twice (a strings.Replacer per
// value) was a tenth of the daemon's CPU (bench/RESULTS.md, issue 15). nats.go does not
// export the publish under PublishMsg that takes the encoded block, so this reaches it
// by name, which ties it to the nats.go version whose signature was checked
// (EncodedPublish): with any other, the block is decoded into a map for PublishMsg, and
// TestEncodedPublishIsOn fails so that an upgrade checks the signature again.
func publishEncoded(nc *nats.Conn, m *nats.Msg, hdr []byte) error {
	if hdr == nil {
		return nc.PublishMsg(m)
	}
	if !EncodedPublish {
		h, err := nats.DecodeHeadersMsg(hdr)
		if err != nil {
			return err
		}
		return nc.PublishMsg(&nats.Msg{Subject: m.Subject, Reply: m.Reply, Header: h, Data: m.Data})
	}
	// publish copies hdr into the connection's buffer, or fails, before it returns.
	return connPublish(nc, m.Subject, m.Reply, m.Reply != "", hdr, m.Data)
}

// EncodedPublish is whether connPublish is known to have the signature declared below,
// that of nats.go's (*Conn).publish at v1.55.0. Tests turn it off to exercise the
// fallback.
var EncodedPublish = nats.Version == "1.55.0"

//go:linkname connPublish github.com/nats-io/nats%2ego.(*Conn).publish
func connPublish(nc *nats.Conn, subj, reply string, validateReply bool, hdr, data []byte) error

// appendHeaderLine appends one "Key: value" line of a header block with value as nats.go
// writes it: trimmed of surrounding white space, with any CR or LF inside turned into a
// space. key must be one nats.go accepts (our constants are).
func appendHeaderLine(b []byte, key, value string) []byte {
	b = append(b, key...)
	b = append(b, ": "...)
	value = textproto.TrimString(value)
	start := len(b)
	b = append(b, value...)
	if strings.IndexByte(value, '\r') >= 0 || strings.IndexByte(value, '\n') >= 0 { // two IndexByte: a tenth of IndexAny's cost
		for i := start; i < len(b); i++ {
			if b[i] == '\r' || b[i] == '\n' {
				b[i] = ' '
			}
		}
	}
	return append(b, crlf...)
}
