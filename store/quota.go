package store

import (
	"context"
	"sync"
	"time"

	"github.com/pisync/pisync/mirror"
)

// ownerCounts caches how many conversations each owner has, for the conversations quota:
// the stream's count is one request that lists every conversation of the owner, too much
// for every create. A count is taken again once older than countTTL and raised by the
// creates of this replica meanwhile, so the quota holds within what other replicas
// create in that time.
type ownerCounts struct {
	mu sync.Mutex
	n  map[string]ownerCount
}

type ownerCount struct {
	n  int
	at time.Time
}

// countTTL is how long a replica trusts an owner's count of conversations.
const countTTL = 10 * time.Second

// checkQuotaConversations refuses a new conversation of an owner at its quota.
func (s *Store) checkQuotaConversations(ctx context.Context, o mirror.Owner) *Error {
	limit := s.opts.MaxConversations
	if limit < 0 {
		return nil
	}
	key := o.KeyPrefix()
	s.counts.mu.Lock()
	c, ok := s.counts.n[key]
	s.counts.mu.Unlock()
	if !ok || time.Since(c.at) > countTTL {
		counts, err := s.handles(o).reader.Counts(ctx)
		if err != nil {
			return errorf(CodeUnavailable, "count the conversations: %v", err)
		}
		c = ownerCount{n: len(counts), at: time.Now()}
		s.counts.mu.Lock()
		s.counts.n[key] = c
		s.counts.mu.Unlock()
	}
	if c.n >= limit {
		s.m.quota.WithLabelValues(ReasonConversations).Inc()
		return tooLarge(ReasonConversations, "conversations", int64(c.n), int64(limit))
	}
	return nil
}

// countCreated raises an owner's cached count by a conversation this replica created.
func (s *Store) countCreated(o mirror.Owner) {
	s.counts.mu.Lock()
	defer s.counts.mu.Unlock()
	if c, ok := s.counts.n[o.KeyPrefix()]; ok {
		c.n++
		s.counts.n[o.KeyPrefix()] = c
	}
}
