package main

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/sysmem"
)

// Returning the memory of a burst once the daemon is quiet again.
//
// The Go runtime keeps the heap pages it has used up to its heap goal (twice the live
// heap with the default GOGC) and gives back only what lies above that. The daemon's
// work comes in bursts, the back-fill at start or a catch-up after an outage, and then it
// idles for hours with a live heap of a few hundred bytes per file; but it kept the
// burst's pages: after back-filling 10,000 files it held about twice its live heap, for
// good. So when the heap holds much free memory and the daemon has allocated next to
// nothing for a while, it collects and returns the free pages to the system
// (debug.FreeOSMemory). Space left in spans that objects of the burst still occupy (a
// fifth of the heap after a back-fill) is not free memory a release can return: the next
// release waits until the heap has grown past what the last one left. That costs a few collections per burst (milliseconds); memory
// limits (GOMEMLIMIT) still apply, and GOGC is left alone against an external server: a
// lower one would make every collection of a busy daemon more frequent (with the embedded
// server it is lowered, see collectEmbeddedMore); a default memory limit would make the
// collector run without end on a host with more files than the limit was chosen for.
//
// With the embedded nats-server much of a burst's memory is the server's: each stream's
// file store keeps the block it writes to cached (4 to 8 MiB a stream) until 10 s after
// the last write, then hands the buffer to a sync.Pool, which keeps it across one more
// collection. None of that is garbage 2 s after the burst, when the first release runs.
// So a second one follows once the daemon has been quiet for longer than the caches
// live: it collects once a tick, three times (the caches, the pools, their victim
// caches), then returns the pages.
//
// Each release also hands back file pages the burst left mapped: those of the checkpoint
// store (bbolt reads through a mapping of its file) and those of the program itself (a
// back-fill runs much of the embedded server's code). They are clean copies of files,
// counted in the daemon's resident memory all the same: a third of it when idle.
const (
	// memCheckInterval is how often the heap is looked at (reading runtime/metrics
	// costs microseconds), how long the daemon must have been quiet for the first
	// release, and the spacing of the collections of the second.
	memCheckInterval = 2 * time.Second
	// memQuietBytes is what the daemon may allocate over one interval and still count as
	// quiet: a rescan of idle files allocates almost nothing, a back-fill or live
	// appends allocate megabytes a second.
	memQuietBytes = 1 << 20
	// memMinFree is the least free heap worth a collection to return.
	memMinFree = 8 << 20
	// memMinSpacing keeps a daemon that alternates between bursts and pauses from
	// collecting more often than this.
	memMinSpacing = time.Minute
	// memSettleAfter is how long the daemon must have been quiet for the second
	// release: longer than the embedded server keeps a block's write cache (10 s).
	memSettleAfter = 12 * time.Second
	// memSettleCollections is the number of collections of the second release.
	memSettleCollections = 3
)

// embeddedGCPercent is GOGC with the embedded server (see collectEmbeddedMore).
const embeddedGCPercent = 50

// collectEmbeddedMore lowers GOGC to embeddedGCPercent, unless the GOGC variable sets it.
//
// With the embedded server the live heap of a back-fill also holds the file store's
// block buffers (up to 70 MB of byte arrays for 10,000 files: cheap to mark, they hold no
// pointers), and the default heap goal, twice the live heap, let as much garbage pile up
// between collections. The objects that outlive the burst (per-file state, the server's
// duplicate index and subject trees) were then spread over the spans of all that garbage,
// which stayed in use, partly empty, for good: 24 MB of the 57 MB heap of an idle daemon
// with 10,000 files, against 14 of 47 with half the default. The back-fill collects twice
// as often, each collection marking the same objects: its heap goal is still above that
// of a daemon using an external server with the default GOGC.
func collectEmbeddedMore() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(embeddedGCPercent)
	}
}

// releaseMemory runs until ctx ends, returning the free heap after each burst.
// releasePages (may be nil) releases the checkpoint store's pages.
func releaseMemory(ctx context.Context, log *zap.Logger, releasePages func() error) {
	samples := []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(samples)
	lastAllocs := samples[0].Value.Uint64()
	var lastRelease, quietSince time.Time
	settle := false  // a release after a burst ran; the second is due once the caches expired
	collections := 0 // of the second release, under way
	busy := false    // the daemon was busy since the last release
	var floor uint64 // the slack the last release left (see slackGrown)
	t := time.NewTicker(memCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(samples)
		allocs := samples[0].Value.Uint64()
		slack, live := slackOf(samples)
		quiet := allocs-lastAllocs < memQuietBytes
		lastAllocs = allocs
		floor = min(floor, slack)
		now := time.Now()
		if !quiet {
			quietSince, collections, busy = time.Time{}, 0, true
			continue
		}
		if quietSince.IsZero() {
			quietSince = now
		}
		if settle && now.Sub(quietSince) >= memSettleAfter {
			if collections++; collections < memSettleCollections {
				runtime.GC()
				continue
			}
			debug.FreeOSMemory()
			settle, collections = false, 0
			releaseFilePages(log, releasePages)
			lastAllocs, floor = released(log, samples, "after the caches of the burst expired")
			continue
		}
		if !slackGrown(slack, floor, live) || now.Sub(lastRelease) < memMinSpacing {
			continue
		}
		// Two collections: the first moves what sync.Pools cache (read buffers, encoders of
		// /metrics) to their victim caches, the second frees it with the rest.
		runtime.GC()
		debug.FreeOSMemory()
		lastRelease, settle = now, busy
		when := "of an idle daemon" // its garbage; the file pages it maps are those it uses
		if busy {
			releaseFilePages(log, releasePages)
			when = "after a burst"
		}
		lastAllocs, floor = released(log, samples, when)
		busy = false
	}
}

// slackOf is what a collection and a release could return, and the live heap: free pages,
// unused space in spans, and the objects beyond those live at the last collection.
func slackOf(samples []metrics.Sample) (slack, live uint64) {
	free, objects, unused := samples[1].Value.Uint64(), samples[2].Value.Uint64(), samples[3].Value.Uint64()
	live = samples[4].Value.Uint64()
	return free + unused + objects - min(objects, live), live
}

// slackGrown reports whether the slack grew enough since the last release (which left
// floor) for another to be worth it. After a burst most of the slack is garbage not
// collected yet, which an idle daemon, allocating next to nothing, would keep for good:
// no collection comes. Less than a quarter of the live heap is the ordinary slack
// between two collections. What a release leaves is the space in spans partly used by
// objects that outlived the burst; no collection frees it, so it does not count again
// (else an idle daemon would collect and release every memMinSpacing for nothing).
func slackGrown(slack, floor, live uint64) bool {
	grown := slack - min(slack, floor)
	return grown >= memMinFree && grown >= live/4
}

// releaseFilePages hands back the file pages of a burst: the program's, and the checkpoint
// store's through releasePages (may be nil).
func releaseFilePages(log *zap.Logger, releasePages func() error) {
	if err := sysmem.ReleaseProgram(); err != nil {
		log.Debug("cannot release the program's pages", zap.Error(err))
	}
	if releasePages != nil {
		if err := releasePages(); err != nil {
			log.Debug("cannot release the checkpoint store's pages", zap.Error(err))
		}
	}
}

// released logs a release and returns the allocation count and the slack after it.
func released(log *zap.Logger, samples []metrics.Sample, when string) (allocs, slack uint64) {
	metrics.Read(samples)
	log.Debug("returned the free heap "+when, zap.Uint64("heap_objects_bytes", samples[2].Value.Uint64()))
	slack, _ = slackOf(samples)
	return samples[0].Value.Uint64(), slack
}
