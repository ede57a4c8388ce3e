package mirror

import (
	"sort"
	"sync"
)

// bufferPool keeps the buffers of acknowledged lines' messages for the next lines, by
// size class: a line's copy was the largest allocation per line, and allocating it fresh
// for every line kept the collector busy (bench/RESULTS.md). Classes are a
// quarter of an octave apart from 1 KiB to 64 KiB, so a buffer is at most a fifth larger
// than asked; longer messages are allocated and left to the collector.
type bufferPool struct {
	sizes [25]int
	pools [25]sync.Pool
}

var lineBuffers = newBufferPool()

func newBufferPool() *bufferPool {
	bp := &bufferPool{}
	for k := range bp.sizes {
		bp.sizes[k] = (1024 << (k / 4)) * (4 + k%4) / 4
	}
	return bp
}

// get returns an empty buffer with room for n bytes.
func (bp *bufferPool) get(n int) *[]byte {
	k := sort.SearchInts(bp.sizes[:], n)
	if k == len(bp.sizes) {
		b := make([]byte, 0, n)
		return &b
	}
	if b, ok := bp.pools[k].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, bp.sizes[k])
	return &b
}

// put takes back a buffer get returned.
func (bp *bufferPool) put(b *[]byte) {
	k := sort.SearchInts(bp.sizes[:], cap(*b))
	if k == len(bp.sizes) || bp.sizes[k] != cap(*b) {
		return // not one of the classes: allocated for a long message
	}
	*b = (*b)[:0]
	bp.pools[k].Put(b)
}
