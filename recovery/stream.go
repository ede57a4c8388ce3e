package recovery

import (
	"context"
	"sync"

	"github.com/pisync/pisync/mirror"
)

// streamBudget bounds the bytes of lines a streamed read holds for conversations whose
// last line it has not reached yet. Past it, the conversation holding the most is dropped
// from the stream and read on its own afterwards, so memory stays bounded however the
// conversations' lines are interleaved in the stream.
var streamBudget int64 = 256 << 20

// streamWorth reports whether reading keys through one pass over the owner's messages
// costs less than a scan per conversation: when they are a good share of the owner's
// conversations (the pass reads all of them) and more than are recovered at once.
func streamWorth(keys, owned, parallel int) bool {
	return keys > parallel && 2*keys >= owned
}

// stream recovers the conversations of keys at the indices todo by reading the owner's
// messages once, in stream order, each conversation handed to a worker as soon as it has
// all the messages the stream held for it when the pass began (counted from the
// server's index of subjects; what comes later is left out, as a scan of one
// conversation leaves out what comes after it started). It returns the indices it did
// not recover: dropped to keep within streamBudget, without messages, or left when the
// pass failed. One reads those, and reports whatever is wrong with them.
func (r *Recoverer) stream(ctx context.Context, sel Selection, todo []int, com *committer) (left []int) {
	keys, heads, counts := sel.Keys, sel.heads, sel.counts
	if counts == nil {
		var err error
		if counts, err = r.m.Counts(ctx); err != nil {
			return todo
		}
	}
	pending := map[string]*collector{}
	index := map[string]int{}
	for _, i := range todo {
		if counts[keys[i]] == 0 {
			left = append(left, i) // One says it is not found
			continue
		}
		var head *mirror.Head
		if h, ok := heads[keys[i]]; ok {
			head = &h
		}
		pending[keys[i]] = newCollector(r.wantGeneration(head), int(min(counts[keys[i]], 1<<16)), r.opts.At)
		index[keys[i]] = i
	}
	if len(pending) == 0 {
		return left
	}

	type job struct {
		i int
		g generation
	}
	jobs := make(chan job, r.opts.Parallel)
	var wg sync.WaitGroup
	for range r.opts.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				key := keys[j.i]
				var head *mirror.Head
				if h, ok := heads[key]; ok {
					head = &h
				}
				com.add(j.i, r.finish(ctx, key, j.g, head, sel.bad[key]))
			}
		}()
	}
	hand := func(key string, c *collector) error {
		delete(pending, key)
		g, err := c.result(key)
		if err != nil { // no line of the generation asked for
			com.add(index[key], outcome{rep: failed(key, r.opts.Generation, Failed, err)})
			return nil
		}
		select {
		case jobs <- job{index[key], g}:
			return nil
		case <-ctx.Done():
			left = append(left, index[key])
			return ctx.Err()
		}
	}

	var held int64
	err := r.m.ScanOwner(ctx, mirror.ScanOptions{}, func(key string, msg mirror.Msg) error {
		c := pending[key]
		if c == nil {
			return nil // not selected, handed over, or dropped
		}
		before := c.bytes
		c.add(msg)
		held += c.bytes - before
		if c.msgs == counts[key] {
			held -= c.bytes
			return hand(key, c)
		}
		for held > streamBudget && len(pending) > 0 {
			k, big := largest(pending)
			held -= big.bytes
			delete(pending, k)
			left = append(left, index[k])
		}
		return nil
	})
	if err == nil {
		// What the pass held to the end is complete: some of the messages counted
		// were not pisync lines, or were deleted meanwhile.
		for key, c := range pending {
			if err = hand(key, c); err != nil {
				break
			}
		}
	}
	close(jobs)
	wg.Wait()
	for key := range pending { // the pass failed: One reads them and says why
		left = append(left, index[key])
	}
	return left
}

// largest returns the pending conversation holding the most bytes.
func largest(pending map[string]*collector) (string, *collector) {
	var key string
	var big *collector
	for k, c := range pending {
		if big == nil || c.bytes > big.bytes || (c.bytes == big.bytes && k < key) {
			key, big = k, c
		}
	}
	return key, big
}
