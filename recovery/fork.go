package recovery

import (
	"errors"
	"fmt"

	"github.com/pisync/pisync/mirror"
)

// ErrIncompleteFork is wrapped when a generation is a fork the session store has not
// finished copying (DESIGN §8: a reader sees all of a fork or nothing): it is not
// restored; the same fork request again completes it.
var ErrIncompleteFork = errors.New("an incomplete fork")

// checkFork refuses a generation whose header marks it a fork with fewer entries than
// the fork's copy makes.
func checkFork(lines []Line) error {
	at := headerIndex(lines)
	if at < 0 {
		return nil
	}
	want, isFork := mirror.ForkEntries(lines[at].fork)
	if !isFork {
		return nil
	}
	var have int64
	seen := map[int64]bool{}
	for _, l := range lines {
		if l.isHeader() || l.Kind == mirror.KindRaw || seen[l.Ordinal] {
			continue
		}
		seen[l.Ordinal] = true
		have++
	}
	if have < want {
		return fmt.Errorf("%w: the session store copied %d of its %d entries; the same fork request again completes it", ErrIncompleteFork, have, want)
	}
	return nil
}
