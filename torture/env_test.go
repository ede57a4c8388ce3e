package torture

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTermAfterFailedStart: a daemon that exited on a start-up error before the stop was
// asked counts as a failed start (restarted by the supervisor), while one that ran and
// then exited with an error is a failed shutdown.
func TestTermAfterFailedStart(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		wantErr  bool
		restarts int
	}{
		{"start-up error", `echo "pisync: stream PISYNC_ENTRIES: context deadline exceeded"; exit 1`, false, 1},
		{"ran, then failed", `echo '{"msg":"pisync running"}'; exit 1`, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &daemon{bin: "/bin/sh", args: []string{"-c", tt.script}, logPath: filepath.Join(t.TempDir(), "daemon.log")}
			if err := d.start(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-d.proc.Exited():
			case <-time.After(30 * time.Second):
				t.Fatal("the script did not exit")
			}
			err := d.term(10 * time.Second)
			if (err != nil) != tt.wantErr {
				t.Fatalf("term: %v, want an error: %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "exit status 1") {
				t.Errorf("term: %v, want the exit status named", err)
			}
			if d.restarts != tt.restarts {
				t.Errorf("restarts %d, want %d", d.restarts, tt.restarts)
			}
		})
	}
}
