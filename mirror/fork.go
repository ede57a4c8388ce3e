package mirror

import (
	"encoding/json"
	"math"
)

// ForkEntries reads HdrFork as the session store writes it on the header of a fork: how
// many entries the fork's copy makes. isFork is false for a header without the mark. A
// mark that does not decode says nothing of what the fork holds, and no count of its
// entries reaches it: such a fork never counts as complete.
func ForkEntries(mark string) (entries int64, isFork bool) {
	if mark == "" {
		return 0, false
	}
	var f struct {
		Entries *int64 `json:"entries"`
	}
	if err := json.Unmarshal([]byte(mark), &f); err != nil || f.Entries == nil || *f.Entries < 0 {
		return math.MaxInt64, true
	}
	return *f.Entries, true
}
