package recovery

import "testing"

func TestDecideLine(t *testing.T) {
	// at is a file of generation 2 whose next ordinal is 5, appendable.
	at := func(f lineFacts) lineFacts {
		f.known, f.fileGen, f.next, f.appendable = true, 2, 5, true
		if f.gen == 0 {
			f.gen = 2
		}
		return f
	}
	for _, tc := range []struct {
		name string
		f    lineFacts
		act  lineAction
		why  lineReason
	}{
		{"the next line is appended", at(lineFacts{ordinal: 5}), appendIt, becauseNext},
		{"a line the file holds is skipped", at(lineFacts{ordinal: 4}), skipIt, becauseHeld},
		{"the header the file holds is skipped", at(lineFacts{ordinal: 0, header: true}), skipIt, becauseHeld},
		{"a line past a hole waits", at(lineFacts{ordinal: 7}), holdIt, becauseAhead},
		{"an older generation's late line is skipped", at(lineFacts{gen: 1, ordinal: 9}), skipIt, becauseOlderGen},
		{"a newer generation rebuilds", at(lineFacts{gen: 3, ordinal: 0}), rebuildIt, becauseNewerGen},
		{"a newer generation's line past the end rebuilds too", at(lineFacts{gen: 3, ordinal: 5}), rebuildIt, becauseNewerGen},
		{"a blob rebuilds (the rebuild streams it)", at(lineFacts{ordinal: 5, blob: true}), rebuildIt, becauseBlob},
		{"a header past line 1 rebuilds", at(lineFacts{ordinal: 5, header: true}), rebuildIt, becauseHeader},
		{"a file with a hole filled is rebuilt, not appended to",
			func() lineFacts { f := at(lineFacts{ordinal: 5}); f.appendable = false; return f }(), rebuildIt, becauseNotAppendable},
		{"a line of a file whose rebuild is due waits for it", at(lineFacts{ordinal: 5, due: true}), rebuildIt, becauseDue},
		{"a line of a file left in place is ignored", at(lineFacts{ordinal: 5, left: true}), ignoreIt, becauseLeft},
		{"left beats a newer generation (the head change retries)", at(lineFacts{gen: 3, left: true}), ignoreIt, becauseLeft},
		{"a new conversation is written", lineFacts{gen: 1, ordinal: 0, header: true}, rebuildIt, becauseNew},
		{"a new conversation's later line too", lineFacts{gen: 1, ordinal: 3}, rebuildIt, becauseNew},
		{"a new conversation of another host is not followed", lineFacts{gen: 1, otherHost: true}, ignoreIt, becauseOtherHost},
		{"a followed conversation continued by another host is followed", at(lineFacts{ordinal: 5, otherHost: true}), appendIt, becauseNext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act, why := decideLine(tc.f)
			if act != tc.act || why != tc.why {
				t.Fatalf("decideLine(%+v) = %s (%s), want %s (%s)", tc.f, act, why, tc.act, tc.why)
			}
		})
	}
}
