package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/publisher"
)

// TestStatusPageListsQuarantinedLines: a line quarantined by the publisher (see
// publisher.TestRefusedLineQuarantinedOthersFlow) appears on the status page with its
// file, line number and reason, and the section is absent while there is none.
func TestStatusPageListsQuarantinedLines(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	render := func(q []publisher.Quarantined) string {
		var page bytes.Buffer
		v := statusView{statusDoc: statusDoc{Quarantined: q, Time: now}, Now: now, Refresh: 5}
		if err := statusPage.Execute(&page, v); err != nil {
			t.Fatal(err)
		}
		return page.String()
	}
	if strings.Contains(render(nil), "Quarantined lines") {
		t.Error("the quarantine section shows with nothing quarantined")
	}
	page := render([]publisher.Quarantined{{Path: "/s/--p--/a.jsonl", Line: 17, Bytes: 40960, Reason: "too_large",
		Error: "message size exceeds maximum allowed", Time: now.Add(-time.Minute)}})
	for _, want := range []string{"Quarantined lines", "/s/--p--/a.jsonl", "17", "too_large", "message size exceeds maximum allowed"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}
