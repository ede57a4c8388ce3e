package main

import (
	"runtime/debug"
	"testing"
)

// TestSlackGrown: a release is due when the slack grew past the floor the last one left
// by at least memMinFree and a quarter of the live heap; the space a burst left in
// partly used spans (the floor) never counts.
func TestSlackGrown(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name               string
		slack, floor, live uint64
		want               bool
	}{
		{"after a burst", 120 * mb, 0, 33 * mb, true},
		{"fragmented, nothing new", 24 * mb, 24 * mb, 33 * mb, false},
		{"fragmented, a little garbage", 30 * mb, 24 * mb, 33 * mb, false},
		{"fragmented, garbage past both bounds", 33 * mb, 24 * mb, 33 * mb, true},
		{"below a quarter of a large live heap", 40 * mb, 0, 200 * mb, false},
		{"below memMinFree of a small heap", 7 * mb, 0, 4 * mb, false},
		{"slack fell below the floor", 10 * mb, 24 * mb, 33 * mb, false},
	} {
		if got := slackGrown(tc.slack, tc.floor, tc.live); got != tc.want {
			t.Errorf("%s: slackGrown(%d, %d, %d) = %v, want %v", tc.name, tc.slack, tc.floor, tc.live, got, tc.want)
		}
	}
}

// TestCollectEmbeddedMore: the embedded default collects at embeddedGCPercent, unless
// GOGC says otherwise.
func TestCollectEmbeddedMore(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	for _, tc := range []struct {
		gogc string
		want int
	}{
		{"", embeddedGCPercent},
		{"200", 100}, // left alone: the runtime read GOGC at start (100 here, set above)
		{"off", 100},
	} {
		t.Setenv("GOGC", tc.gogc)
		debug.SetGCPercent(100)
		collectEmbeddedMore()
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: GC percent %d, want %d", tc.gogc, got, tc.want)
		}
	}
}
