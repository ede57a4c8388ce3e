package store

import (
	"sync"
	"time"

	"github.com/pisync/pisync/mirror"
)

// openCache keeps the snapshots recently read by open (a generation up to a stream
// sequence), bounded in bytes, for the continuations of an open; and, for each
// conversation, the newest of them, from which the next open reads only what came after.
type openCache struct {
	mu     sync.Mutex
	max    int64
	size   int64
	items  map[string]openItem
	newest map[string]string // conversation (head key) → key of its newest snapshot
}

type openItem struct {
	msgs  []mirror.Msg
	bytes int64
	at    time.Time
	of    snapshotOrigin
}

// snapshotOrigin says which conversation a snapshot is of, and where it ends: generation
// gen whose header is at headerSeq (a conversation deleted and created again has another
// header), up to stream sequence last.
type snapshotOrigin struct {
	conv      string
	gen       int
	headerSeq uint64
	last      uint64
}

// snapshotTTL is how long a snapshot is kept after it was read.
const snapshotTTL = time.Minute

func newOpenCache(max int64) *openCache {
	return &openCache{max: max, items: map[string]openItem{}, newest: map[string]string{}}
}

func (oc *openCache) get(key string) ([]mirror.Msg, bool) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	it, ok := oc.items[key]
	if ok && time.Since(it.at) > snapshotTTL {
		oc.drop(key)
		return nil, false
	}
	return it.msgs, ok
}

// base returns the newest snapshot of generation gen of conv whose header is at
// headerSeq, if one is kept: an open of a later state reads only what follows it.
func (oc *openCache) base(conv string, gen int, headerSeq uint64) ([]mirror.Msg, uint64, bool) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	key, ok := oc.newest[conv]
	if !ok {
		return nil, 0, false
	}
	it := oc.items[key]
	if time.Since(it.at) > snapshotTTL {
		oc.drop(key)
		return nil, 0, false
	}
	if it.of.gen != gen || it.of.headerSeq != headerSeq || headerSeq == 0 {
		return nil, 0, false
	}
	return it.msgs, it.of.last, true
}

// put keeps msgs under key; when of names a conversation, as its newest snapshot.
func (oc *openCache) put(key string, msgs []mirror.Msg, of snapshotOrigin) {
	var n int64
	for _, m := range msgs {
		n += int64(len(m.Data)) + 200
	}
	if n > oc.max/4 {
		return
	}
	oc.mu.Lock()
	defer oc.mu.Unlock()
	for oc.size+n > oc.max && len(oc.items) > 0 {
		oldest := ""
		for k, it := range oc.items {
			if oldest == "" || it.at.Before(oc.items[oldest].at) {
				oldest = k
			}
		}
		oc.drop(oldest)
	}
	if _, ok := oc.items[key]; ok {
		oc.drop(key)
	}
	oc.items[key] = openItem{msgs: msgs, bytes: n, at: time.Now(), of: of}
	oc.size += n
	if of.conv != "" {
		if prev, ok := oc.newest[of.conv]; !ok || oc.items[prev].of.last <= of.last {
			oc.newest[of.conv] = key
		}
	}
}

// drop removes the snapshot under key. The caller holds oc.mu.
func (oc *openCache) drop(key string) {
	it, ok := oc.items[key]
	if !ok {
		return
	}
	oc.size -= it.bytes
	delete(oc.items, key)
	if it.of.conv != "" && oc.newest[it.of.conv] == key {
		delete(oc.newest, it.of.conv)
	}
}
