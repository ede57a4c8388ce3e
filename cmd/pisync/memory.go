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
// good. So when the heap holds much free memory and the daemon has allocated next to
// nothing for a while, it collects and returns the free pages to the system
// (debug.FreeOSMemory). That costs a few collections per burst (milliseconds); memory
// limits (GOMEMLIMIT) still apply, and GOGC is left alone: a lower one would make every
// collection of a busy daemon more frequent, and a default memory limit would make the
// collector run without end on a host with more files than the limit was chosen for.
//
// With the embedded nats-server much of a burst's memory is the server's: each stream's
// file store keeps the block it writes to cached (4 to 8 MiB a stream) until 10 s after
// the last write, then hands the buffer to a sync.Pool, which keeps it across one more
// collection. None of that is garbage 2 s after the burst, when the first release runs.
// So a second one follows once the daemon has been quiet for longer than the caches
// live: it collects once a tick, three times (the caches, the pools, their victim
// caches), then returns the pages.
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
	var lastRelease, quietSince time.Time
	settle := false  // a first release ran; the second is due once the caches expired
	collections := 0 // of the second release, under way
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
		now := time.Now()
		if !quiet {
			quietSince, collections = time.Time{}, 0
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
			lastAllocs = released(log, samples, "after the caches of the burst expired")
			continue
		}
		// What a collection and a release could return: free pages, unused space in
		// spans, and the objects beyond those live at the last collection. After a burst
		// most of it is garbage not collected yet, which an idle daemon, allocating next
		// to nothing, would keep for good: no collection comes. Less than a quarter of the
		// live heap is the ordinary slack between two collections.
		slack := free + unused + objects - min(objects, live)
		if slack < memMinFree || slack < live/4 || now.Sub(lastRelease) < memMinSpacing {
			continue
		}
		// Two collections: the first moves what sync.Pools cache (read buffers, encoders of
		// /metrics) to their victim caches, the second frees it with the rest.
		runtime.GC()
		debug.FreeOSMemory()
		lastRelease, settle = now, true
		lastAllocs = released(log, samples, "after a burst")
	}
}

// released logs a release and returns the allocation count after it.
func released(log *zap.Logger, samples []metrics.Sample, when string) uint64 {
	metrics.Read(samples)
	log.Debug("returned the free heap "+when, zap.Uint64("heap_objects_bytes", samples[2].Value.Uint64()))
	return samples[0].Value.Uint64()
}
