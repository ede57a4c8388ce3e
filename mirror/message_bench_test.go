package mirror

import (
	"testing"
)

// BenchmarkNewMsg builds the message of a back-fill line (bench/RESULTS.md, issue 15):
// "map" as the session store does (NewMsg), "pooled" as the publisher does
// (NewOutgoing, its message and header map reused once acknowledged).
func BenchmarkNewMsg(b *testing.B) {
	c := acmeConv(b)
	l := Line{Kind: KindEntry, EntryID: "a1b2c3d4", ParentID: "9f8e7d6c", EntryType: "message", Ordinal: 1234,
		Generation: 1, SHA256: "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", Format: "v3",
		Host: "host-1", Source: "--home-dev-p--/2026-01-05T10-00-00-000Z_0196a0b4.jsonl"}
	body := make([]byte, 2600)
	names := DefaultNames()
	b.Run("map", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = names.NewMsg(c, l, body)
		}
	})
	b.Run("pooled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			names.NewOutgoing(c, l, body).Release()
		}
	})
}
