package fleet

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// Mix is the fleet's make-up and pace.
type Mix struct {
	Hosts           int
	IdleFiles       [2]int        // sessions of an idle host: log-uniform in [min, max]
	Appending       float64       // share of hosts with a conversation going on
	Backfilling     float64       // share of hosts started over sessions never mirrored
	AppendEvery     time.Duration // mean pause between two lines of a live conversation
	BackfillFiles   int           // sessions of a back-filling host
	BackfillEntries int           // entries of each of them
}

// kindOf gives host i its kind: back-filling and appending hosts spread evenly.
func (m Mix) kindOf(i int) Kind {
	switch {
	case m.Backfilling > 0 && i%int(math.Round(1/m.Backfilling)) == 1:
		return Backfilling
	case m.Appending > 0 && i%int(math.Round(1/m.Appending)) == 0:
		return Appending
	}
	return Idle
}

// pi writes one host's sessions the way Pi does (sessiontest: one append per line).
type pi struct {
	h       *Host
	rng     *rand.Rand
	live    *sessiontest.File // the conversation going on (Appending)
	written atomic.Int64      // bytes written to every session of the host
	lines   atomic.Int64      // lines written to every session of the host
}

const cwd = "/home/dev/project"

// prepare writes the host's sessions before its daemon starts: files sessions of a
// header and entries lines each.
func (p *pi) prepare(files, entries int) error {
	for range files {
		f := sessiontest.New(p.rng, p.h.Root, cwd, sessiontest.Format(p.rng.IntN(3)))
		lines := [][]byte{f.HeaderLine(cwd)}
		for range entries {
			lines = append(lines, f.Entry(entrySize(p.rng)))
		}
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o700); err != nil {
			return err
		}
		if err := f.Append(lines...); err != nil {
			return fmt.Errorf("%s: %w", p.h.Name, err)
		}
		for _, l := range lines {
			p.written.Add(int64(len(l) + 1))
		}
		p.lines.Add(int64(len(lines)))
		p.live = f
	}
	return nil
}

// entrySize is the length of a Pi line: log-uniform between 200 B and 8 KiB (the
// shape bench/capacity_test.go measures disk with).
func entrySize(rng *rand.Rand) int {
	return int(200 * math.Exp(rng.Float64()*math.Log(8192.0/200)))
}

// converse appends a line to the live conversation every AppendEvery on average
// (uniform in [½, 1½]×), notifying the watcher as inotify would, until ctx ends.
func (p *pi) converse(ctx context.Context, every time.Duration) error {
	for {
		pause := time.Duration((0.5 + p.rng.Float64()) * float64(every))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		line := p.live.Entry(entrySize(p.rng))
		if err := p.live.Append(line); err != nil {
			return fmt.Errorf("%s: %w", p.h.Name, err)
		}
		p.written.Add(int64(len(line) + 1))
		p.lines.Add(1)
		p.h.feed.Load().wrote(p.live.Path, false)
	}
}
