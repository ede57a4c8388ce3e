package recovery

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// flush appends the lines decided so far to their files, each file's lines in one write.
func (f *Follower) flush() {
	f.flushWhere(func(string) bool { return true })
}

// flushKey appends the lines decided so far for key (before its file is rebuilt).
func (f *Follower) flushKey(key string) {
	f.flushWhere(func(k string) bool { return k == key })
}

func (f *Follower) flushWhere(take func(key string) bool) {
	if len(f.pending) == 0 {
		return
	}
	type batch struct {
		data        []byte
		lines       int
		first, last int64
		stored      time.Time
	}
	batches := map[string]*batch{}
	var order []string
	rest := f.pending[:0]
	for _, p := range f.pending {
		if !take(p.key) {
			rest = append(rest, p)
			continue
		}
		b, ok := batches[p.key]
		if !ok {
			b = &batch{first: p.msg.Ordinal, stored: p.msg.Time}
			batches[p.key] = b
			order = append(order, p.key)
		}
		b.data = append(append(b.data, p.data...), '\n')
		b.lines++
		b.last = p.msg.Ordinal
		f.buffered -= int64(len(p.data)) + 1
	}
	clear(f.pending[len(rest):])
	f.pending = rest
	for _, k := range order {
		b, st := batches[k], f.files[k]
		if st.left || st.deleted || st.dirty {
			continue // a rebuild writes them, or the file is left alone
		}
		n, err := appendAt(st.path, st.size, b.data)
		st.size += n
		if err != nil {
			st.left, st.leftWhy = true, err.Error()
			st.retryAt = time.Now().Add(f.opts.Retry)
			if f.opts.OnReport != nil {
				f.opts.OnReport(Report{Key: k, Conversation: k, Generation: st.gen, Output: st.path, Result: Refused, Reason: err.Error()})
			}
			continue
		}
		f.mu.Lock()
		f.status.Appended += uint64(b.lines)
		f.mu.Unlock()
		if f.opts.OnAppend != nil {
			f.opts.OnAppend(k, b.first, b.last, b.stored)
		}
	}
}

// appendAt appends data (whole lines) to the file at path, whose size must be size: a
// file of another size was changed by someone else, and is not written. It returns how
// many bytes it wrote.
func appendAt(path string, size int64, data []byte) (int64, error) {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return 0, fmt.Errorf("append to %s: %w", path, err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return 0, fmt.Errorf("append to %s: %w", path, err)
	}
	if fi.Size() != size {
		return 0, fmt.Errorf("%w: %s is %d bytes, the follower left it at %d; it is left as it is (move it aside, or stop what writes it, and the follower rebuilds it)",
			ErrLocalChange, path, fi.Size(), size)
	}
	n, err := fh.Write(data)
	if err != nil {
		return int64(n), fmt.Errorf("append to %s: %w", path, err)
	}
	return int64(n), nil
}

// queue is an unbounded queue between a producer that must not block and one consumer.
type queue[T any] struct {
	mu    sync.Mutex
	items []T
	wake  chan struct{}
}

func newQueue[T any]() *queue[T] { return &queue[T]{wake: make(chan struct{}, 1)} }

func (q *queue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// ready is signalled when items were pushed since the last take.
func (q *queue[T]) ready() <-chan struct{} { return q.wake }

func (q *queue[T]) take() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
