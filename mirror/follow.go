package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Followed is one line of the owner's conversations, delivered as the stream stores it.
type Followed struct {
	Key string // conversation key
	Msg
	// Pending is how many of the owner's messages the stream held past this one when it
	// was delivered: 0 means the follower has caught up with the mirror.
	Pending uint64
}

// Follow delivers the owner's lines from stream sequence from on, in stream order, as
// they are stored, until ctx ends or fn fails: the live half of `recover --follow`. It
// reads through an ordered consumer, which nats.go recreates from the last sequence
// delivered after a disconnect, a server restart or a missed heartbeat, so a line is
// never skipped and never delivered twice.
func (r *Reader) Follow(ctx context.Context, from uint64, fn func(Followed) error) error {
	filter := r.names.OwnerSubjects(r.owner)
	prefix := strings.TrimSuffix(filter, ">")
	cons, err := r.js.OrderedConsumer(ctx, r.names.Stream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    max(from, 1),
	})
	if err != nil {
		return fmt.Errorf("follow %s/%s: create consumer: %w", r.owner.Tenant, r.owner.Name, err)
	}
	defer r.deleteConsumer(cons)
	it, err := cons.Messages(jetstream.PullMaxMessages(scanBatch))
	if err != nil {
		return fmt.Errorf("follow %s/%s: %w", r.owner.Tenant, r.owner.Name, err)
	}
	defer it.Stop()
	keys := map[string]string{} // subject → key: subjects repeat, line after line
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("follow %s/%s: %w", r.owner.Tenant, r.owner.Name, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("follow: metadata: %w", err)
		}
		msg, ok := toMsg(m, meta, false)
		if !ok {
			continue
		}
		key, ok := keys[m.Subject()]
		if !ok {
			k, err := DecodeToken(strings.TrimPrefix(m.Subject(), prefix))
			if err != nil {
				continue // not a conversation subject pisync writes
			}
			key, keys[m.Subject()] = k, k
		}
		if err := fn(Followed{Key: key, Msg: msg, Pending: meta.NumPending}); err != nil {
			return err
		}
	}
}

// HeadChange is a change of one of the owner's heads.
type HeadChange struct {
	Key     string // conversation key
	Head    Head   // the new head; zero when Deleted or Err
	Deleted bool   // the head was deleted or purged
	Err     error  // the new value does not decode (wraps ErrBadHead)
}

// WatchHeads calls fn with each change of the owner's heads made from now on, until ctx
// ends: what `recover --follow` learns a conversation's place, deletion and newest
// generation from.
func (r *Reader) WatchHeads(ctx context.Context, fn func(HeadChange)) error {
	prefix := r.owner.KeyPrefix()
	w, err := r.heads.WatchFiltered(ctx, []string{prefix + "*"}, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("watch heads: %w", err)
	}
	defer w.Stop() //nolint:errcheck // the watch is over either way
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch heads: the watch ended")
			}
			if e == nil || !strings.HasPrefix(e.Key(), prefix) {
				continue
			}
			key, err := DecodeToken(strings.TrimPrefix(e.Key(), prefix))
			if err != nil {
				continue
			}
			c := HeadChange{Key: key}
			if e.Operation() != jetstream.KeyValuePut {
				c.Deleted = true
			} else if h, err := DecodeHead(e.Value()); err != nil {
				c.Err = fmt.Errorf("%w: %v", ErrBadHead, err)
			} else {
				c.Head = h
			}
			fn(c)
		}
	}
}
