package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"go.uber.org/zap"
)

// Returning the memory of a burst once the daemon is quiet again.
//
// The Go runtime keeps the heap pages it has used up to its heap goal (twice the live
// heap with the default GOGC) and gives back only what lies above that. The daemon's
// work comes in bursts, the back-fill at start or a catch-up after an outage, and then it
// idles for hours with a live heap of a few hundred bytes per file; but it kept the
// burst's pages: after back-filling 10,000 files it held about twice its live heap, for
// good. So when the daemon has been quiet for a while after a burst, it collects and
// returns the free pages to the system (debug.FreeOSMemory). That costs a few collections
// per burst (milliseconds); memory limits (GOMEMLIMIT) still apply, and GOGC is left
// alone: a lower one would make every collection of a busy daemon more frequent, and a
// default memory limit would make the collector run without end on a host with more
// files than the limit was chosen for.
//
// With the embedded nats-server most of a burst's memory is the server's: each stream's
// file store keeps the block it writes to cached (up to 8 MiB a stream) until 10 s after
// the last write, then hands the buffer to a sync.Pool, which keeps it across one more
// collection. None of that is garbage at the first collection after the burst, so the
// release waits until the caches have expired and then collects once a tick, three
// times (the caches, the pools, their victim caches), before returning the pages.
const (
	// memCheckInterval is how often the heap is looked at (reading runtime/metrics
	// costs microseconds), and the spacing of the collections of a release.
	memCheckInterval = 2 * time.Second
	// memQuietBytes is what the daemon may allocate over one interval and still count as
	// quiet: a rescan of idle files allocates almost nothing, a back-fill or live
	// appends allocate megabytes a second.
	memQuietBytes = 1 << 20
	// memQuietFor is how long the daemon must have been quiet before a release: longer
	// than the embedded server keeps a block's write cache after its last write (10 s).
	memQuietFor = 12 * time.Second
	// memMinFree is the least free heap worth a collection to return.
	memMinFree = 8 << 20
	// memBurstBytes is what the daemon must have allocated since the last release for a
	// burst to count, whatever the heap looks like: what a burst leaves in caches and
	// pools looks live until the collections of a release.
	memBurstBytes = 32 << 20
	// memCollections is the number of collections of a release, one per interval.
	memCollections = 3
	// memMinSpacing keeps a daemon that alternates between bursts and pauses from
	// collecting more often than this.
	memMinSpacing = time.Minute
)

// releaseMemory runs until ctx ends, returning the free heap after each burst.
func releaseMemory(ctx context.Context, log *zap.Logger) {
	samples := []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(samples)
	lastAllocs := samples[0].Value.Uint64()
	releasedAt := lastAllocs // allocations counted at the last release
	var lastRelease, quietSince time.Time
	collections := 0 // of the release under way
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
		free, objects, unused, live := samples[1].Value.Uint64(), samples[2].Value.Uint64(), samples[3].Value.Uint64(), samples[4].Value.Uint64()
		quiet := allocs-lastAllocs < memQuietBytes
		lastAllocs = allocs
		if !quiet {
			quietSince, collections = time.Time{}, 0
			continue
		}
		now := time.Now()
		if quietSince.IsZero() {
			quietSince = now
		}
		if collections > 0 {
			// A release under way: one more collection, then the pages go back.
			collections++
			if collections < memCollections {
				runtime.GC()
				continue
			}
			debug.FreeOSMemory()
			collections, lastRelease = 0, now
			metrics.Read(samples)
			lastAllocs, releasedAt = samples[0].Value.Uint64(), samples[0].Value.Uint64()
			log.Debug("returned the free heap after a burst", zap.Uint64("heap_objects_bytes", samples[2].Value.Uint64()))
			continue
		}
		// What a collection and a release could return: free pages, unused space in
		// spans, and the objects beyond those live at the last collection. After a burst
		// most of it is garbage not collected yet, which an idle daemon, allocating next
		// to nothing, would keep for good: no collection comes. Less than a quarter of the
		// live heap is the ordinary slack between two collections.
		slack := free + unused + objects - min(objects, live)
		worth := slack >= memMinFree && slack >= live/4 || allocs-releasedAt >= memBurstBytes
		if !worth || now.Sub(quietSince) < memQuietFor || now.Sub(lastRelease) < memMinSpacing {
			continue
		}
		runtime.GC()
		collections = 1
	}
}
