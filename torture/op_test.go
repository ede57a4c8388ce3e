package torture

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Kind is one kind of operation of a schedule.
type Kind int

// The operations. Their order is part of what a seed means: append new kinds at the end
// (before kindCount), never in between, so that old seeds keep their schedules.
const (
	Append          Kind = iota // one entry at Pi's pace (one open-append-close)
	Burst                       // many entries back to back
	Torn                        // a line written in two writes, the second one much later
	Complete                    // the second write of every torn line
	Create                      // a new session: harness (header alone) or CLI (header and entries at once)
	RewriteSame                 // Pi's in-place rewrite (open "w", one write per line) of the same bytes
	RewriteSameSize             // in-place rewrite with one line changed, same length, same boundaries
	RewriteResized              // in-place rewrite with one line changed in length
	Truncate                    // in-place rewrite without the last lines
	Replace                     // rewrite by atomic rename of a new file over the old one
	Migrate                     // a v1 file migrated to v3 in place (same id, new entry ids)
	MigrateNew                  // a v1 file migrated to v3 under a new name; the old one kept or deleted
	Rename                      // move within the roots (another directory, or the other root)
	RenameOut                   // move out of the roots
	RenameIn                    // move a file moved out back into a root
	Delete                      // remove a session file
	Copy                        // a copy under a new name: two files, one session id
	Huge                        // a line above the blob threshold (sometimes above max_payload)
	Damaged                     // a blank line, a line that is not JSON, a CRLF line
	Glue                        // a writer crashed mid-line; the next line is glued to its fragment
	DupID                       // an entry repeating an id already in the file
	Kill                        // SIGKILL of the daemon, restart after a while
	Term                        // SIGTERM of the daemon (graceful), restart
	StateLoss                   // SIGKILL, the state directory removed, restart
	NatsRestart                 // nats-server (or one cluster node) stopped, started after a while
	Recover                     // `pisync recover --all --out` running concurrently
	Survey                      // `pisync status` and `pisync verify` running concurrently
	Restore                     // a mirrored file deleted and restored by `pisync recover --root`
	Check                       // a quiet point: wait for catch-up, check every invariant
	HeaderOnly                  // a file overwritten in place by a fresh header only (Pi #6002, oh-my-pi #9915)
	TitleFirst                  // a new session with oh-my-pi's title record before its header (Pi #8880)
	BackfillRewrite             // a large new file rewritten in place (a line changed, lines added) while it is first read
	kindCount
)

var kindNames = [...]string{"append", "burst", "torn", "complete", "create", "rewrite-same", "rewrite-same-size",
	"rewrite-resized", "truncate", "replace", "migrate", "migrate-new", "rename", "rename-out", "rename-in", "delete",
	"copy", "huge", "damaged", "glue", "dup-id", "kill", "term", "state-loss", "nats-restart", "recover", "survey",
	"restore", "check", "header-only", "title-first", "backfill-rewrite"}

func (k Kind) String() string {
	if k >= 0 && k < kindCount {
		return kindNames[k]
	}
	return "kind" + strconv.Itoa(int(k))
}

// ParseKinds parses a comma-separated list of kind names.
func ParseKinds(s string) (map[Kind]bool, error) {
	out := map[Kind]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.Index(kindNames[:], name)
		if i < 0 {
			return nil, fmt.Errorf("unknown operation kind %q (known: %s)", name, strings.Join(kindNames[:], ", "))
		}
		out[Kind(i)] = true
	}
	return out, nil
}

// KindList is the comma-separated list of the kinds in set, in kind order.
func KindList(set map[Kind]bool) string {
	var names []string
	for k := range kindCount {
		if set[k] {
			names = append(names, k.String())
		}
	}
	return strings.Join(names, ",")
}

// weights say how often each kind is drawn (per thousand ops, roughly).
var weights = [kindCount]int{
	Append: 220, Burst: 40, Torn: 60, Complete: 30, Create: 50, RewriteSame: 20, RewriteSameSize: 30,
	RewriteResized: 25, Truncate: 15, Replace: 20, Migrate: 15, MigrateNew: 15, Rename: 20, RenameOut: 10,
	RenameIn: 10, Delete: 12, Copy: 15, Huge: 25, Damaged: 20, Glue: 10, DupID: 8, Kill: 25, Term: 8,
	StateLoss: 8, NatsRestart: 20, Recover: 12, Survey: 12, Restore: 8, HeaderOnly: 10, TitleFirst: 12,
	BackfillRewrite: 6,
}

// Op is one operation of a schedule. Its randomness comes from its own source, seeded
// from the run's seed and its index, so that it does the same whichever other operations
// a shrunk schedule keeps.
type Op struct {
	Index int
	Kind  Kind
}

// Schedule draws n operations for seed: three Creates, then a Check every 15 to 40
// operations and one at the end.
func Schedule(seed uint64, n int) []Op {
	rng := rand.New(rand.NewPCG(seed, 1))
	total := 0
	for _, w := range weights {
		total += w
	}
	var ops []Op
	nextCheck := 15 + rng.IntN(26)
	for i := range n {
		k := Check
		if i < 3 {
			k = Create // a run starts with a few sessions
		} else if i == n-1 || i == nextCheck {
			nextCheck = i + 15 + rng.IntN(26)
		} else {
			r := rng.IntN(total)
			for k = 0; r >= weights[k]; k++ {
				r -= weights[k]
			}
		}
		ops = append(ops, Op{Index: i, Kind: k})
	}
	return ops
}

// rngFor is the random source of operation i of seed.
func rngFor(seed uint64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 1000+uint64(i)))
}

// ParseOps parses a selection of operation indexes: "N" (the first N), or a comma-separated
// list of indexes and ranges "a-b". Empty selects every operation.
func ParseOps(s string) (func(int) bool, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return func(int) bool { return true }, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		return func(i int) bool { return i < n }, nil
	}
	keep := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("operations %q: %v", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("operations %q: %v", s, err)
			}
		}
		for i := a; i <= b; i++ {
			keep[i] = true
		}
	}
	return func(i int) bool { return keep[i] }, nil
}

// FormatOps writes indexes as ParseOps reads them, with runs as ranges.
func FormatOps(idx []int) string {
	var parts []string
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", idx[i], idx[j]))
		} else {
			parts = append(parts, strconv.Itoa(idx[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
