package recovery

// What the follower does with each line the mirror stores: a pure decision over what it
// knows of the line and of the file it keeps for the line's conversation, tested by one
// table (followdecide_test.go).

// lineAction is what the follower does with one line.
type lineAction int

const (
	// appendIt: the line is the next one of the file's generation; it is appended.
	appendIt lineAction = iota
	// skipIt: the file already holds it (the recovery that wrote the file read it, or a
	// line of an older generation arrived late).
	skipIt
	// holdIt: a line past the next one; it waits for the ones before it, which the
	// stream stores out of order after a resend.
	holdIt
	// rebuildIt: the file is rebuilt from the mirror, by recovery's atomic replace.
	rebuildIt
	// ignoreIt: the follower does not follow the conversation (another host's, with
	// --host), or has left its file in place until its head changes.
	ignoreIt
)

var lineActionNames = [...]string{"append", "skip", "hold", "rebuild", "ignore"}

func (a lineAction) String() string { return lineActionNames[a] }

// lineReason says why.
type lineReason int

const (
	becauseNext          lineReason = iota // the next ordinal of the file's generation
	becauseHeld                            // the file holds the ordinal already
	becauseOlderGen                        // a line of a generation older than the file's
	becauseAhead                           // an ordinal past the next one
	becauseNew                             // a conversation the follower has no file of
	becauseNewerGen                        // a newer generation: the file is replaced whole
	becauseNotAppendable                   // the file is not the mirror's lines as they are (a hole was filled)
	becauseBlob                            // a line stored as a blob: the rebuild streams it
	becauseHeader                          // a header line past line 1 (a fork's copy)
	becauseOtherHost                       // --host names another host
	becauseLeft                            // the file is left in place (refused, or deleted at its source)
	becauseDue                             // a rebuild is due: it writes the line
)

var lineReasonNames = [...]string{"next", "held", "older generation", "ahead", "new conversation",
	"newer generation", "not appendable", "blob", "header", "other host", "left in place", "rebuild due"}

func (r lineReason) String() string { return lineReasonNames[r] }

// lineFacts is what the follower knows when a line arrives.
type lineFacts struct {
	known bool // the follower keeps a file of the line's conversation
	// left: the follower left the conversation's file in place (recovery refused it, or
	// the conversation was deleted at its source) until its head changes.
	left      bool
	otherHost bool // the line is of a host --host does not name, of a conversation not followed yet
	due       bool // a rebuild of the file is due (it reads the line from the mirror)
	// fileGen and next: the generation the file holds and the ordinal it lacks first.
	fileGen int
	next    int64
	// appendable: the file is exactly the mirror's lines 0..next-1 (plus a synthesized
	// header), so that a line appended keeps it what recovery would write.
	appendable bool

	gen     int   // the line's generation
	ordinal int64 // the line's ordinal
	blob    bool  // the line is stored as a blob
	header  bool  // the line is a header
}

// decideLine decides what to do with one line.
func decideLine(f lineFacts) (lineAction, lineReason) {
	switch {
	case !f.known && f.otherHost:
		return ignoreIt, becauseOtherHost
	case f.left:
		return ignoreIt, becauseLeft
	case !f.known:
		return rebuildIt, becauseNew
	case f.due:
		return rebuildIt, becauseDue
	case f.gen < f.fileGen:
		return skipIt, becauseOlderGen
	case f.gen > f.fileGen:
		return rebuildIt, becauseNewerGen
	case f.ordinal < f.next:
		return skipIt, becauseHeld
	case f.ordinal > f.next:
		return holdIt, becauseAhead
	case !f.appendable:
		return rebuildIt, becauseNotAppendable
	case f.blob:
		return rebuildIt, becauseBlob
	case f.header:
		return rebuildIt, becauseHeader
	}
	return appendIt, becauseNext
}
