package verify

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pisync/pisync/mirror"
)

// State is how far one local session is mirrored.
type State string

// The states of `pisync status`.
const (
	StateSynced      State = "synced"        // every complete line is mirrored, no torn tail
	StatePending     State = "pending"       // complete lines wait to be mirrored
	StateTorn        State = "torn"          // mirrored up to a torn last line, held back
	StateError       State = "error"         // unreadable, or the mirror holds more than the file
	StateMissing     State = "local-missing" // mirrored from this host, the local file is gone
	StateNotMirrored State = "not-mirrored"  // the mirror does not know the file
	StateNoHead      State = "no-head"       // the stream holds the conversation, without a usable head
	// StateDrift: the session store writes the conversation (DESIGN §8) and the local
	// file was appended to since: its lines are mirrored as a generation apart.
	StateDrift State = "drift"
	// StateShrunk: the file's newest generation lacks entries of the one before it (a
	// fresh header written over it, cut back, rewritten without some lines): the data
	// is in the older generation, which recover --generation restores.
	StateShrunk State = "shrunk"
	// StateSkipped: a .jsonl under a root that is no session in any form (the detail
	// says why): the daemon skips it, and nothing under a root is invisible.
	StateSkipped State = "skipped"
	// StateDiverged: copies of the conversation on two hosts both went on past the lines
	// they share (a primary back after its standby took over): one continues the
	// conversation's key, the other is mirrored whole under a key of its own. Both are
	// mirrored; the detail names the two hosts and keys.
	StateDiverged State = "diverged"
	// StateBehind: another host's copy of the conversation, which the mirror follows,
	// holds more than this file (a standby not caught up, a primary back after its
	// standby took over): the file publishes nothing; lines appended to it later are
	// mirrored apart (diverged).
	StateBehind State = "behind"
)

// States lists every state in display order.
var States = []State{StateSynced, StatePending, StateTorn, StateError, StateMissing, StateNotMirrored, StateNoHead, StateDrift, StateShrunk,
	StateDiverged, StateBehind, StateSkipped}

// SessionStatus is the line of one session in `pisync status`.
type SessionStatus struct {
	Path          string  `json:"path"`
	Conversation  string  `json:"conversation,omitempty"`
	Key           string  `json:"key,omitempty"`
	State         State   `json:"state"`
	Detail        string  `json:"detail,omitempty"`
	LocalBytes    int64   `json:"local_bytes"`
	MirroredBytes int64   `json:"mirrored_bytes"`
	Percent       float64 `json:"percent"`
	TornBytes     int64   `json:"torn_bytes,omitempty"`
	Generation    int     `json:"generation,omitempty"`
	// LagSeconds: for a pending or torn session, how long the mirror of it has not
	// advanced; for one not mirrored, how long since the file was last written. 0 when
	// synced.
	LagSeconds float64   `json:"lag_seconds"`
	MirroredAt time.Time `json:"mirrored_at,omitzero"` // the head's last update
	Host       string    `json:"host,omitempty"`       // host recorded in the head
}

// Totals sum the sessions of the host.
type Totals struct {
	Sessions      int           `json:"sessions"`
	States        map[State]int `json:"states"`
	LocalBytes    int64         `json:"local_bytes"`
	MirroredBytes int64         `json:"mirrored_bytes"`
	Percent       float64       `json:"percent"`
	MaxLagSeconds float64       `json:"max_lag_seconds"`
}

// MirrorTotals sum the heads of the caller's tenant and owner, over every host.
// Conversations counts those the stream holds without a usable head as well.
type MirrorTotals struct {
	Tenant        string    `json:"tenant"`
	Owner         string    `json:"owner"`
	Conversations int       `json:"conversations"`
	WithoutHead   int       `json:"without_head"` // of Conversations: in the stream, no usable head
	BadHeads      int       `json:"bad_heads"`    // values of the heads bucket that do not decode
	Hosts         int       `json:"hosts"`
	Entries       int64     `json:"entries"`
	Bytes         int64     `json:"bytes"`
	LocalDeleted  int       `json:"local_deleted"`
	Diverged      int       `json:"diverged"`            // of Conversations: copies mirrored apart after another host continued them
	UpdatedAt     time.Time `json:"updated_at,omitzero"` // newest head update
}

// StatusReport is the whole of `pisync status`.
type StatusReport struct {
	Host     string          `json:"host"`
	Time     time.Time       `json:"time"`
	Sessions []SessionStatus `json:"sessions"`
	Local    Totals          `json:"host_totals"`
	Mirror   MirrorTotals    `json:"mirror_totals"`
	// Headless are the conversations of the stream without a usable head that no local
	// file carries; Warnings say why a head was skipped.
	Headless []Headless `json:"without_head"`
	Warnings []string   `json:"warnings,omitempty"`
}

// Status computes the state of each surveyed pair (see Survey) at time now, and totals
// for the host and, from heads and the stream, for the owner.
func Status(sv Surveyed, o mirror.Owner, host string, now time.Time) StatusReport {
	rep := StatusReport{Host: host, Time: now, Local: Totals{States: map[State]int{}}, Headless: sv.Headless}
	if rep.Headless == nil {
		rep.Headless = []Headless{}
	}
	heads := sv.Heads
	withoutHead := len(sv.Headless)
	for _, b := range sv.BadHeads {
		rep.Warnings = append(rep.Warnings, b.Warning())
	}
	copies := map[string][]mirror.Head{} // conversation key → the heads of its diverged copies
	for _, h := range heads {
		if d := h.DivergedFrom; d != nil {
			copies[d.Key] = append(copies[d.Key], h)
		}
	}
	for _, p := range sv.Pairs {
		if p.Headless != nil {
			withoutHead++
		}
		s := sessionStatus(p, host, now)
		if s.State == StateSynced && p.Head != nil {
			diverged(&s, p.Head, copies[p.Head.ConvKey()])
		}
		rep.Sessions = append(rep.Sessions, s)
		t := &rep.Local
		t.States[s.State]++
		if s.State == StateSkipped {
			continue // not a session: counted by its state only
		}
		t.Sessions++
		t.LocalBytes += s.LocalBytes
		t.MirroredBytes += min(s.MirroredBytes, s.LocalBytes)
		t.MaxLagSeconds = max(t.MaxLagSeconds, s.LagSeconds)
	}
	rep.Local.Percent = percent(rep.Local.MirroredBytes, rep.Local.LocalBytes)
	sort.SliceStable(rep.Sessions, func(i, j int) bool { return rep.Sessions[i].Path < rep.Sessions[j].Path })
	m := &rep.Mirror
	m.Tenant, m.Owner, m.Conversations = o.Tenant, o.Name, len(heads)+withoutHead
	m.WithoutHead, m.BadHeads = withoutHead, len(sv.BadHeads)
	hosts := map[string]bool{}
	for _, h := range heads {
		hosts[h.Host] = true
		m.Entries += h.Entries
		m.Bytes += h.Bytes
		if h.LocalDeleted {
			m.LocalDeleted++
		}
		if h.DivergedFrom != nil {
			m.Diverged++
		}
		if h.UpdatedAt.After(m.UpdatedAt) {
			m.UpdatedAt = h.UpdatedAt
		}
	}
	m.Hosts = len(hosts)
	return rep
}

func sessionStatus(p Pair, host string, now time.Time) SessionStatus {
	var s SessionStatus
	if h := p.Head; h != nil {
		s.Conversation, s.Key, s.Generation = h.Conversation, h.Key, h.Generation
		s.MirroredBytes, s.MirroredAt, s.Host = h.Bytes, h.UpdatedAt, h.Host
		s.Path = filepath.Join(h.Root, filepath.FromSlash(h.Source))
	}
	f := p.File
	if f == nil {
		s.State, s.Detail, s.Percent = StateMissing, "the mirror keeps it; pisync recover restores it", 100
		return s
	}
	s.Path, s.LocalBytes, s.TornBytes = f.Path, f.Size, f.Torn
	if f.HeaderOK && s.Conversation == "" {
		s.Conversation = f.Header.ID
	}
	if p.Head != nil {
		s.Percent = percent(min(p.Head.Bytes, f.Size), f.Size)
	}
	complete := f.Size - f.Torn
	sinceWrite := max(now.Sub(f.ModTime).Seconds(), 0)
	switch {
	case f.Err != nil:
		s.State, s.Detail = StateError, f.Err.Error()
	case f.Skipped != "":
		s.State, s.Percent = StateSkipped, 0
		s.Detail = "not a Pi session in any form (" + f.Skipped + "): the daemon does not mirror it"
	case p.Head == nil && !f.HeaderOK:
		s.State, s.Detail, s.LagSeconds = StateTorn, "the first line is not complete yet", sinceWrite
	case p.Headless != nil:
		s.State, s.Key = StateNoHead, p.Headless.Key
		s.Detail = fmt.Sprintf("the stream holds %d lines of it, but no usable head (%s); pisync verify compares the file with them", p.Headless.Messages, p.Headless.Reason)
	case p.Head == nil:
		s.State, s.LagSeconds = StateNotMirrored, sinceWrite
	case p.Head.Shrunk != nil:
		sh := p.Head.Shrunk
		s.State = StateShrunk
		s.Detail = fmt.Sprintf("generation %d lacks %d entries of generation %d (%s); pisync recover --conversation %s --generation %d restores it",
			p.Head.Generation, sh.Missing, sh.From, sh.Reason, p.Head.ConvKey(), sh.From)
	case p.Head.StoreWrites():
		storeWritten(&s, p.Head, complete)
	case p.Head.Bytes > complete && p.Head.Host != host:
		s.State = StateBehind
		s.Detail = fmt.Sprintf("%s's copy of this conversation holds %d bytes, this file %d complete ones: this file publishes nothing, and is mirrored apart if lines are appended to it (pisync verify shows what differs)",
			p.Head.Host, p.Head.Bytes, complete)
	case p.Head.Bytes > complete:
		s.State = StateError
		s.Detail = fmt.Sprintf("the mirror holds %d bytes, the file %d complete ones: rewritten or truncated since (pisync verify shows what differs)", p.Head.Bytes, complete)
	case p.Head.Bytes < complete:
		s.State = StatePending
		s.Detail = fmt.Sprintf("%d bytes to mirror", complete-p.Head.Bytes)
		s.LagSeconds = max(now.Sub(p.Head.UpdatedAt).Seconds(), 0)
	case f.Torn > 0:
		s.State = StateTorn
		s.Detail = fmt.Sprintf("a torn last line of %d bytes is held back until it is complete", f.Torn)
		s.LagSeconds = max(now.Sub(p.Head.UpdatedAt).Seconds(), 0)
	default:
		s.State = StateSynced
	}
	return s
}

// diverged makes the state of a synced file whose conversation has copies on two hosts
// that each went on past their shared lines (DESIGN, failover) diverged, naming both
// hosts: the file h describes is either the copy mirrored under a key of its own
// (h.DivergedFrom), or the one continuing the conversation that copies (the heads of
// their keys) diverged from.
func diverged(s *SessionStatus, h *mirror.Head, copies []mirror.Head) {
	if d := h.DivergedFrom; d != nil {
		s.State = StateDiverged
		s.Detail = fmt.Sprintf("this copy (%s's) and %s's both went on after line %d of conversation %s (generation %d): %s's continues it, this one is mirrored whole under %s; pisync recover --conversation %s --out DIR restores it",
			h.Host, d.Host, d.Ordinal, d.Key, d.Generation, d.Host, h.ConvKey(), h.ConvKey())
		return
	}
	if len(copies) == 0 {
		return
	}
	sort.Slice(copies, func(i, j int) bool { return copies[i].ConvKey() < copies[j].ConvKey() })
	var others []string
	for _, c := range copies {
		others = append(others, fmt.Sprintf("%s's copy went on after line %d and is mirrored whole under %s", c.Host, c.DivergedFrom.Ordinal, c.ConvKey()))
	}
	s.State = StateDiverged
	s.Detail = fmt.Sprintf("this copy (%s's) continues the conversation; %s", h.Host, strings.Join(others, "; "))
}

// storeWritten is the state of a local file whose conversation the session store writes
// (DESIGN §8): synced while the file holds no more than the lines mirrored before the
// cut-over, drift once it was appended to (the daemon mirrors it as a generation of its
// own, recorded in the head's Local part).
func storeWritten(s *SessionStatus, h *mirror.Head, complete int64) {
	mirrored := h.Bytes
	if l := h.Local; l != nil {
		mirrored, s.MirroredAt = l.Bytes, l.UpdatedAt
	}
	s.MirroredBytes, s.Percent = mirrored, percent(min(mirrored, s.LocalBytes), s.LocalBytes)
	if h.Local == nil && complete <= h.Bytes {
		s.State = StateSynced
		s.Detail = fmt.Sprintf("the session store writes this conversation (generation %d) since the cut-over; the file holds its first lines", h.Generation)
		return
	}
	s.State = StateDrift
	s.Detail = fmt.Sprintf("the session store writes this conversation (generation %d); the local file was appended to since the cut-over", h.Generation)
	if l := h.Local; l != nil {
		s.Detail += fmt.Sprintf(" and is mirrored apart as generation %d", l.Generation)
	}
	if complete > mirrored {
		s.Detail += fmt.Sprintf(", %d bytes not mirrored yet", complete-mirrored)
	}
	s.Detail += "; pisync recover rebuilds the store's generation"
}

func percent(part, whole int64) float64 {
	if whole <= 0 {
		return 100
	}
	return 100 * float64(part) / float64(whole)
}
