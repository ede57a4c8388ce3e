//go:build !purego

package session

import (
	"math/rand/v2"
	"testing"
)

// TestScanEntrySWAR runs the table tests through the SWAR string scan, which
// machines without AVX2 use.
func TestScanEntrySWAR(t *testing.T) {
	defer func(old bool) { useSIMD = old }(useSIMD)
	useSIMD = false
	t.Run("accepts", TestScanEntry)
	t.Run("rejects", TestScanEntryRejects)
	t.Run("offsets", TestScanEntryErrorOffset)
}

// TestEscapedBytes checks the odd-run trick against walking the backslashes
// one by one.
func TestEscapedBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 200000 {
		bs := rng.Uint64() & rng.Uint64() // runs of every length
		if n%2 == 0 {
			bs |= rng.Uint64()
		}
		var want, wantPast uint64
		for k := 0; k < 64; k++ {
			if bs>>k&1 == 1 {
				if k == 63 {
					wantPast = 1
				} else {
					want |= 1 << (k + 1)
				}
				k++ // the escaped byte
			}
		}
		if got, past := escapedBytes(bs); got != want || past != wantPast {
			t.Fatalf("escapedBytes(%064b)\n= %064b, %d\nwant %064b, %d", bs, got, past, want, wantPast)
		}
	}
}
