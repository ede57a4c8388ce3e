package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// On an R3 stream most reads may be answered by any replica: a direct get by whichever
// answers first, an ordered consumer by the random peer the server places it on. A
// replica that has just come back answers too, from a store behind its leader, so a read
// right after a node restart can miss lines the leader acknowledged long ago (a resume
// would resend them, recover rebuild a short file). STREAM.INFO is the one read an owner
// may make that tells the leader's state: with a subject filter it counts each subject's
// messages. Followers answer it as well in two cases (the group has no leader in their
// view; a just-restarted preferred replica), so the answer is used only when the leader
// gave it, and reads wait until they have what the leader counted.

// leaderRetry bounds the wait between two asks when only followers answered: a leader
// is being elected or a follower answered first.
const (
	leaderRetryMin = 20 * time.Millisecond
	leaderRetryMax = 500 * time.Millisecond
	// leaderAnswerWait is how long an ask waits for the leader's answer once a
	// follower's has arrived: the leader answers in the same moment when there is one.
	leaderAnswerWait = 250 * time.Millisecond
)

// ErrNoLeader is wrapped when no answer of the stream's leader came before the context
// ended: the stream has no leader, or only lagging replicas answered.
var ErrNoLeader = errors.New("the stream's leader did not answer")

// streamInfoPage is the part of a STREAM.INFO response a leader check and a count need.
type streamInfoPage struct {
	Error  *jetstream.APIError `json:"error,omitempty"`
	Total  int                 `json:"total"`
	Offset int                 `json:"offset"`
	State  struct {
		LastSeq  uint64            `json:"last_seq"`
		Subjects map[string]uint64 `json:"subjects"`
	} `json:"state"`
	Cluster *struct {
		Name        string     `json:"name"`
		Leader      string     `json:"leader"`
		LeaderSince *time.Time `json:"leader_since"`
	} `json:"cluster"`
}

// fromLeader reports whether the stream's leader gave the answer. In a cluster only the
// leader reports since when it leads, and only once it has applied everything its
// predecessors committed (nats-server raft: leader_since is set after the leader's own
// first entry is applied); a follower's answer has none. A server outside a cluster
// names no cluster: its answer is the stream's state.
func (p *streamInfoPage) fromLeader() bool {
	return p.Cluster == nil || p.Cluster.Name == "" || p.Cluster.LeaderSince != nil
}

// leaderCounts asks the stream's leader how many messages each subject matching filter
// holds, and the stream's newest sequence. It pages through subjects as the server
// lists them (100,000 per answer).
func (r *Reader) leaderCounts(ctx context.Context, filter string) (map[string]uint64, uint64, error) {
	return leaderCounts(ctx, r.js, r.names.Stream(), filter)
}

// leaderCounts is Reader.leaderCounts for any stream (the object store's, for its chunks).
func leaderCounts(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string]uint64, uint64, error) {
	nc := js.Conn()
	inbox := nc.NewInbox()
	replies := make(chan *nats.Msg, 8)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil, 0, fmt.Errorf("stream info: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	subject := apiPrefix(js.Options()) + "STREAM.INFO." + stream
	counts := map[string]uint64{}
	var last uint64
	for offset := 0; ; {
		req, err := json.Marshal(struct {
			Filter string `json:"subjects_filter"`
			Offset int    `json:"offset,omitempty"`
		}{filter, offset})
		if err != nil {
			return nil, 0, err
		}
		page, err := askLeader(ctx, nc, subject, inbox, req, offset, replies)
		if err != nil {
			return nil, 0, err
		}
		if offset == 0 {
			last = page.State.LastSeq
		}
		for s, n := range page.State.Subjects {
			counts[s] = n
		}
		offset += len(page.State.Subjects)
		if len(page.State.Subjects) == 0 || offset >= page.Total {
			return counts, last, nil
		}
	}
}

// askLeader sends one STREAM.INFO request and returns the leader's answer, asking again
// (with a growing pause) while only followers answer.
func askLeader(ctx context.Context, nc *nats.Conn, subject, inbox string, req []byte, offset int, replies <-chan *nats.Msg) (*streamInfoPage, error) {
	pause := leaderRetryMin
	var lastErr error
	for {
		if err := nc.PublishRequest(subject, inbox, req); err != nil {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		// A reply lost while a node comes back must not wait out the whole context:
		// ask again after a while. An answer to an earlier ask still counts when it
		// comes (a page of 100,000 subjects takes seconds).
		wait := time.NewTimer(askAgainAfter)
		page, err := leaderReply(ctx, replies, wait, offset)
		wait.Stop()
		switch {
		case page != nil:
			return page, nil
		case err != nil && !errors.Is(err, errNotLeader):
			return nil, err
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr == nil {
				lastErr = ctx.Err()
			}
			return nil, fmt.Errorf("stream info: %w (%w)", ErrNoLeader, lastErr)
		case <-time.After(pause):
		}
		pause = min(2*pause, leaderRetryMax)
	}
}

// askAgainAfter is how long one ask waits for any answer before it is asked again.
const askAgainAfter = 5 * time.Second

var errNotLeader = errors.New("answered by a replica that is not the leader")

// leaderReply reads the answers to one ask until the leader's arrives. It returns
// errNotLeader when only followers answered, or none did, leaving the caller to ask
// again. Answers of an earlier ask of the same page that come late are read like the
// others: any answer of the leader's is as good as another; those of an earlier page
// are dropped.
func leaderReply(ctx context.Context, replies <-chan *nats.Msg, wait *time.Timer, offset int) (*streamInfoPage, error) {
	var notLeader error
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stream info: %w", ctx.Err())
		case <-wait.C:
			if notLeader != nil {
				return nil, notLeader
			}
			return nil, fmt.Errorf("stream info: %w: %w", errNotLeader, nats.ErrTimeout)
		case m := <-replies:
			if m.Header.Get("Status") == "503" {
				return nil, fmt.Errorf("stream info: %w", nats.ErrNoResponders)
			}
			var page streamInfoPage
			if err := json.Unmarshal(m.Data, &page); err != nil {
				return nil, fmt.Errorf("stream info: %w", err)
			}
			if page.Error == nil && page.Offset != offset {
				continue // a late answer to the ask of an earlier page
			}
			if !page.fromLeader() || page.Error != nil && page.Error.Code == 503 {
				// A follower answers errors too, and "JetStream cluster not
				// available" is no answer about the stream: ask again.
				notLeader = errNotLeader
				if page.Error != nil {
					notLeader = fmt.Errorf("%w: %w", errNotLeader, page.Error)
				}
				wait.Reset(leaderAnswerWait)
				continue
			}
			if page.Error != nil {
				return nil, fmt.Errorf("stream info: %w", page.Error)
			}
			return &page, nil
		}
	}
}
