package mirror

import (
	"context"
	"fmt"
	"sort"
)

// Listing is an owner's conversations as the mirror holds them: the stream's count of
// each one's messages, which is the list itself, and the heads, which only add metadata.
// A conversation whose head is missing or does not decode is listed all the same
// (DESIGN §4), and a head without messages is not dropped: each is reported.
type Listing struct {
	Heads  []Head            // every head that decodes, ordered by key
	Bad    []BadHead         // values of the heads bucket that do not decode
	Counts map[string]uint64 // messages of each conversation in the stream, by key
}

// Conversations lists the reader's owner's conversations: the heads (ListHeads), then
// the stream's count of each conversation's messages (Counts). The heads are read first:
// a head is written after the messages it accounts for are acknowledged, so a count
// taken after it holds at least them. It fails when either cannot be read: a listing
// without one could leave conversations out without saying so.
func (r *Reader) Conversations(ctx context.Context) (Listing, error) {
	heads, err := r.ListHeads(ctx)
	if err != nil {
		return Listing{}, err
	}
	counts, err := r.Counts(ctx)
	if err != nil {
		return Listing{}, fmt.Errorf("list the conversations in the stream: %w", err)
	}
	return Listing{Heads: heads.Heads, Bad: heads.Bad, Counts: counts}, nil
}

// ByKey maps each conversation key to its head, for the heads that decode.
func (l Listing) ByKey() map[string]Head {
	m := make(map[string]Head, len(l.Heads))
	for _, h := range l.Heads {
		m[h.ConvKey()] = h
	}
	return m
}

// HeadErrors maps each conversation key whose head does not decode to why (an error
// wrapping ErrBadHead). A bad head whose bucket key does not decode either names no
// conversation and is only in Bad.
func (l Listing) HeadErrors() map[string]error {
	m := map[string]error{}
	for _, b := range l.Bad {
		if b.Conversation != "" {
			m[b.Conversation] = b.Err
		}
	}
	return m
}

// Keys are every conversation of the owner, sorted: those the stream has messages of,
// and those with a head, usable or not, but no message.
func (l Listing) Keys() []string {
	set := make(map[string]bool, len(l.Counts)+len(l.Heads))
	for key := range l.Counts {
		set[key] = true
	}
	for _, h := range l.Heads {
		set[h.ConvKey()] = true
	}
	for key := range l.HeadErrors() {
		set[key] = true
	}
	keys := make([]string, 0, len(set))
	for key := range set {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
