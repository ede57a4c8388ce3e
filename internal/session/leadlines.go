package session

import (
	"bytes"
	"errors"
	"io"
)

// LeadBuffer gathers the first complete lines of a file as Identify takes them: at most
// LeadLines of them, and no more than LeadBytes held in all. A line that cannot be held
// (longer than the budget left, or not kept by its reader) is nil, and counts as an
// entry: Pi's long lines are images and tool outputs, never a header. Once a line has
// been held, the first line past the budget ends the lead. The daemon's watcher and
// `pisync status` both read a file's lead through it, so they always agree on what a file
// is.
type LeadBuffer struct {
	Lines [][]byte // copies of the lines, without their newlines
	More  bool     // a complete line follows Lines
	held  int64
}

// Add offers the next complete line of the file: data is its bytes without the newline,
// or nil when the reader did not keep them; n is its length. data is copied. Add returns
// false once the lead is complete: no further line is wanted.
func (b *LeadBuffer) Add(data []byte, n int64) bool {
	if len(b.Lines) == LeadLines {
		b.More = true
		return false
	}
	if len(b.Lines) > 0 && b.held+n > LeadBytes {
		// A line past the budget is there all the same, so that a large entry after a
		// title still makes the file a session.
		b.Lines, b.More = append(b.Lines, nil), true
		return false
	}
	var kept []byte
	if data != nil && b.held+n <= LeadBytes {
		kept = bytes.Clone(data)
		b.held += n
	}
	b.Lines = append(b.Lines, kept)
	return true
}

// errLeadComplete stops ReadLines once a LeadBuffer is full.
var errLeadComplete = errors.New("lead complete")

// leadReadBuf is ReadLead's read buffer: the first lines are short, and status reads
// the lead of thousands of files.
const leadReadBuf = 4096

// ReadLead reads the lead of the file r from its beginning into a LeadBuffer, in bounded
// memory whatever its lines' lengths, hashing nothing (status reads thousands of leads,
// some beginning with a line of megabytes).
func ReadLead(r io.Reader) (LeadBuffer, error) {
	var b LeadBuffer
	_, err := readLines(r, leadReadBuf, false, func(l DigestedLine) error {
		if !b.Add(l.Prefix, l.Size) {
			return errLeadComplete
		}
		return nil
	})
	if err != nil && !errors.Is(err, errLeadComplete) {
		return LeadBuffer{}, err
	}
	return b, nil
}
