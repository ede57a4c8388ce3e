package session_test

import (
	"math/rand/v2"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// BenchmarkScanEntryPi scans the Pi-shaped message entries the publisher's BenchmarkLine
// and bench/'s workloads send: 2.6 KB, an escape every few words.
func BenchmarkScanEntryPi(b *testing.B) {
	sf := sessiontest.New(rand.New(rand.NewPCG(15, 15)), b.TempDir(), "/home/dev/p", sessiontest.CLIV3)
	var lines [][]byte
	n := 0
	for range 64 {
		l := sf.Message(2600)
		lines = append(lines, l)
		n += len(l)
	}
	b.SetBytes(int64(n / len(lines)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := session.ScanEntry(lines[i%len(lines)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
