package session

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// benchLine builds an assistant message line of about size bytes, shaped like
// Pi's: compact JSON, short structural strings, a few long texts with escapes,
// numbers and nested objects.
func benchLine(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"type":"message","id":"a1b2c3d4","parentId":"9f8e7d6c","timestamp":"2026-01-05T10:00:02.123Z","message":{"role":"assistant","content":[`)
	for i := 0; b.Len() < size-300; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if i%3 == 2 {
			b.WriteString(`{"type":"toolCall","id":"call_` + strconv.Itoa(i) + `","name":"bash","arguments":{"command":"grep -rn \"func \" ./... | head -n 20","timeout":120}}`)
			continue
		}
		b.WriteString(`{"type":"text","text":"`)
		b.WriteString(strings.Repeat(`The quick brown fox jumps over the lazy dog; tabs\tand \"quotes\" and newlines\n. `, 6))
		b.WriteString(`"}`)
	}
	b.WriteString(`],"provider":"anthropic","model":"claude-sonnet-4-5","usage":{"input":1234,"output":567,"cacheRead":0,"cost":{"total":0.0123}},"stopReason":"stop","timestamp":1767607202123}}`)
	return []byte(b.String())
}

func benchScan(b *testing.B, line []byte) {
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ScanEntry(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScanEntry(b *testing.B) {
	for _, size := range []int{512, 8 << 10, 1 << 20} {
		b.Run(strconv.Itoa(size), func(b *testing.B) { benchScan(b, benchLine(size)) })
	}
	b.Run("base64_1MiB", func(b *testing.B) {
		// A pasted image: one huge string without escapes.
		line := []byte(`{"type":"message","id":"a1b2c3d4","parentId":"9f8e7d6c","timestamp":"t","message":{"role":"user","content":[{"type":"image","mimeType":"image/png","data":"` +
			strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA", 1<<20/72) + `"}]}}`)
		benchScan(b, line)
	})
	b.Run("escaped_id", func(b *testing.B) {
		benchScan(b, []byte(`{"type":"m\u0065ssage","id":"a1b2\u0063\u0033d4","parentId":"9f8e7d6c","timestamp":"2026-01-05T10:00:02.123Z"}`))
	})
}

// BenchmarkEncodingJSON is the yardstick ScanEntry is meant to beat: the
// obvious encoding/json approach to the same envelope.
func BenchmarkEncodingJSON(b *testing.B) {
	line := benchLine(8 << 10)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		var e struct {
			Type, ID, ParentID, TargetID, Timestamp *string
		}
		if err := json.Unmarshal(line, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestScanEntryAllocs pins the allocation budget: none for a known type
// alone, one for all extracted strings together, escapes or not.
func TestScanEntryAllocs(t *testing.T) {
	tests := []struct {
		line string
		max  float64
	}{
		{`{"type":"message","message":{"role":"user","content":"hi"}}`, 0},
		{string(benchLine(8 << 10)), 1},
		{`{"type":"unknown_type","id":"a1b2c3d4","parentId":"9f8e7d6c","targetId":"x","timestamp":"2026-01-05T10:00:02.123Z"}`, 1},
		{`{"type":"m\u0065ssage","id":"a1b2\u0063\u0033d4","parentId":"9f8e7d6c","timestamp":"2026-01-05T10:00:02.123Z"}`, 1},
	}
	for _, tt := range tests {
		line := []byte(tt.line)
		got := testing.AllocsPerRun(100, func() {
			if _, err := ScanEntry(line); err != nil {
				t.Fatal(err)
			}
		})
		if got > tt.max {
			t.Errorf("ScanEntry(%.60q) allocates %v times, want <= %v", line, got, tt.max)
		}
	}
}
