//go:build !purego

package session

import "testing"

// TestScanEntrySWAR runs the table tests through the SWAR string scan, which
// machines without AVX2 use.
func TestScanEntrySWAR(t *testing.T) {
	defer func(old bool) { useSIMD = old }(useSIMD)
	useSIMD = false
	t.Run("accepts", TestScanEntry)
	t.Run("rejects", TestScanEntryRejects)
	t.Run("offsets", TestScanEntryErrorOffset)
}
