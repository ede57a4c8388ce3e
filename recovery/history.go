package recovery

import (
	"context"
	"fmt"

	"github.com/pisync/pisync/mirror"
)

// ConvHistory is what `pisync history` shows of one conversation key: its generations,
// each compared with the one before, and the head (nil when the bucket has none or it
// does not decode).
type ConvHistory struct {
	Key         string           `json:"key"`
	Head        *mirror.Head     `json:"head,omitempty"`
	Generations []mirror.GenInfo `json:"generations"`
}

// History reads the generations of conversation key from its messages' headers only.
func History(ctx context.Context, m Mirror, key string) (ConvHistory, error) {
	c, err := m.Conv(key)
	if err != nil {
		return ConvHistory{}, fmt.Errorf("%w: %v", mirror.ErrNotFound, err)
	}
	head, _, err := headOf(ctx, m, c)
	if err != nil {
		return ConvHistory{}, err
	}
	g := generation{hist: &mirror.History{}}
	err = m.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, func(msg mirror.Msg) error {
		g.hist.Add(msg)
		return nil
	})
	if err != nil {
		return ConvHistory{}, err
	}
	gens := g.history(head)
	if len(gens) == 0 && head == nil {
		return ConvHistory{}, fmt.Errorf("conversation %s: %w", key, mirror.ErrNotFound)
	}
	return ConvHistory{Key: key, Head: head, Generations: gens}, nil
}
