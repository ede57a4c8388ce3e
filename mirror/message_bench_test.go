package mirror

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// BenchmarkNewMsg builds the message of a back-fill line (bench/RESULTS.md, issue 15):
// "recycled" hands each header map back as the publisher does once the line's only
// publish is acknowledged.
func BenchmarkNewMsg(b *testing.B) {
	c := acmeConv(b)
	l := Line{Kind: KindEntry, EntryID: "a1b2c3d4", ParentID: "9f8e7d6c", EntryType: "message", Ordinal: 1234,
		Generation: 1, SHA256: "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", Format: "v3",
		Host: "host-1", Source: "--home-dev-p--/2026-01-05T10-00-00-000Z_0196a0b4.jsonl"}
	body := make([]byte, 2600)
	names := DefaultNames()
	for _, recycle := range []bool{false, true} {
		name := map[bool]string{false: "dropped", true: "recycled"}[recycle]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var m *nats.Msg
			for b.Loop() {
				m = names.NewMsg(c, l, body)
				if recycle {
					RecycleHeader(m)
				}
			}
		})
	}
}
