package verify

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// Scanner reads a conversation's messages; *mirror.Reader implements it.
type Scanner interface {
	Conv(key string) (mirror.Conv, error)
	Scan(ctx context.Context, c mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error
}

var _ Scanner = (*mirror.Reader)(nil)

// DriftKind says how a local file and its mirror copy differ at one line.
type DriftKind string

// The kinds of drift.
const (
	DriftMissing DriftKind = "missing" // the mirror holds a line the file no longer has
	DriftExtra   DriftKind = "extra"   // the file holds a line the mirror lacks (inserted, or a hole in the mirror)
	DriftChanged DriftKind = "changed" // same position, other bytes, found nowhere in the mirror
	DriftOrder   DriftKind = "order"   // a mirrored line, but before a line that follows it in the mirror
)

// DriftItem is one difference.
type DriftItem struct {
	Kind       DriftKind `json:"kind"`
	Line       int64     `json:"line,omitempty"`        // 1-based line of the local file; 0: none
	MirrorLine int64     `json:"mirror_line,omitempty"` // 1-based line of the mirror copy (ordinal + 1); 0: none
	EntryID    string    `json:"entry_id,omitempty"`
}

// Drift is what Verify found for one file.
type Drift struct {
	Path         string      `json:"path"`
	Key          string      `json:"key"`
	Generation   int         `json:"generation"`
	LocalLines   int64       `json:"local_lines"`   // complete lines of the file
	MirrorLines  int64       `json:"mirror_lines"`  // lines of the mirror copy
	PendingLines int64       `json:"pending_lines"` // lines after the mirrored ones, not mirrored yet: not drift
	TornBytes    int64       `json:"torn_bytes,omitempty"`
	Items        []DriftItem `json:"drift,omitempty"`
}

// Drifted reports whether the file and its mirror copy differ.
func (d Drift) Drifted() bool { return len(d.Items) > 0 }

// Counts returns the number of items of each kind.
func (d Drift) Counts() map[DriftKind]int {
	c := map[DriftKind]int{}
	for _, it := range d.Items {
		c[it.Kind]++
	}
	return c
}

// Verify compares the local file at path with the newest generation of its mirror copy
// (the conversation of head), line by line by digest, reading only message headers.
// Lines the file holds past the mirrored ones are pending, not drift, and so is a torn
// tail. It streams the file, so memory grows with the number of lines, not their size.
// The daemon's background verification can call it as it is.
func Verify(ctx context.Context, m Scanner, path string, head mirror.Head) (Drift, error) {
	key := head.ConvKey()
	d := Drift{Path: path, Key: key}
	c, err := m.Conv(key)
	if err != nil {
		return d, fmt.Errorf("verify %s: %w", path, err)
	}
	mirrored := map[int64]string{} // ordinal → digest, newest generation, first stored
	ids := map[int64]string{}      // ordinal → entry id, for the report
	err = m.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, func(msg mirror.Msg) error {
		switch {
		case msg.Generation < d.Generation:
			return nil
		case msg.Generation > d.Generation:
			d.Generation, mirrored, ids = msg.Generation, map[int64]string{}, map[int64]string{}
		}
		if _, dup := mirrored[msg.Ordinal]; !dup {
			mirrored[msg.Ordinal] = msg.SHA256
			if (msg.Kind == mirror.KindEntry || msg.Kind == mirror.KindBlob) && msg.OwnEntryID() != "" {
				ids[msg.Ordinal] = msg.EntryID
			}
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("verify %s: %w", path, err)
	}
	if len(mirrored) == 0 {
		return d, fmt.Errorf("verify %s: conversation %s: %w", path, key, mirror.ErrNotFound)
	}
	last := int64(-1)
	where := make(map[string]int64, len(mirrored)) // digest → first ordinal
	for o, sha := range mirrored {
		last = max(last, o)
		if w, ok := where[sha]; !ok || o < w {
			where[sha] = o
		}
	}
	d.MirrorLines = int64(len(mirrored))

	// The local side first, whole, so that a line can be told inserted from changed.
	f, err := os.Open(path)
	if err != nil {
		return d, fmt.Errorf("verify %s: %w", path, err)
	}
	type lline struct{ sha, id string }
	var local []lline
	inFile := map[string]bool{}
	d.TornBytes, err = session.ReadLines(f, func(l session.DigestedLine) error {
		local = append(local, lline{l.SHA256, l.EntryID()})
		inFile[l.SHA256] = true
		return nil
	})
	f.Close()
	if err != nil {
		return d, fmt.Errorf("verify %s: %w", path, err)
	}
	d.LocalLines = int64(len(local))

	changed := map[int64]bool{}
	maxSeen := int64(-1) // highest mirror ordinal matched so far
	for i, l := range local {
		o := int64(i)
		j, inMirror := where[l.sha]
		if mirrored[o] == l.sha {
			j, inMirror = o, true
		}
		theirs, hasO := mirrored[o]
		switch {
		case inMirror:
			if j < maxSeen {
				d.Items = append(d.Items, DriftItem{Kind: DriftOrder, Line: o + 1, MirrorLine: j + 1, EntryID: l.id})
			}
			maxSeen = max(maxSeen, j)
		case o > last:
			d.PendingLines++
		case hasO && !inFile[theirs]:
			changed[o] = true
			d.Items = append(d.Items, DriftItem{Kind: DriftChanged, Line: o + 1, MirrorLine: o + 1, EntryID: firstNonEmpty(l.id, ids[o])})
		default:
			d.Items = append(d.Items, DriftItem{Kind: DriftExtra, Line: o + 1, EntryID: l.id})
		}
	}
	for o, sha := range mirrored {
		if !inFile[sha] && !changed[o] {
			d.Items = append(d.Items, DriftItem{Kind: DriftMissing, MirrorLine: o + 1, EntryID: ids[o]})
		}
	}
	sort.SliceStable(d.Items, func(i, j int) bool { return position(d.Items[i]) < position(d.Items[j]) })
	return d, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// position orders drift items by where they are: local line, else mirror line.
func position(it DriftItem) int64 {
	if it.Line > 0 {
		return it.Line
	}
	return it.MirrorLine
}
