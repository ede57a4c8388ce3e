package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// verdictsVersion is the format of the verdicts file; a file of another version is
// ignored (every file is read once more), never misread.
const verdictsVersion = 1

// verdictsFile is what Background.StateFile holds: the verdicts of the files found
// identical, so that a restarted daemon does not read them all again (a fleet restarted
// at once would otherwise cost the cluster a read of every file of every host one
// interval later).
type verdictsFile struct {
	Version  int                     `json:"version"`
	Verdicts map[string]verdictEntry `json:"verdicts"` // by path
}

type verdictEntry struct {
	Key   string    `json:"key"`
	Size  int64     `json:"size"`
	MTime time.Time `json:"mtime"` // RFC 3339 with nanoseconds: compared with Equal
	Msgs  uint64    `json:"msgs"`
	At    time.Time `json:"at"`
}

// loadVerdicts reads the verdicts saved by an earlier daemon. A missing file is a first
// start; an unreadable one is logged and ignored: the price is one read of every file.
func loadVerdicts(path string, log *zap.Logger) map[string]verdict {
	known := map[string]verdict{}
	if path == "" {
		return known
	}
	// Left by a daemon killed while saving: the rename never happened.
	stale, _ := filepath.Glob(path + ".tmp-*")
	for _, p := range stale {
		_ = os.Remove(p)
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Debug("no verification verdicts saved yet; every file is read", zap.String("path", path))
		return known
	}
	var f verdictsFile
	if err == nil {
		if err = json.Unmarshal(b, &f); err == nil && f.Version != verdictsVersion {
			err = fmt.Errorf("version %d, want %d", f.Version, verdictsVersion)
		}
	}
	if err != nil {
		log.Warn("cannot read the saved verification verdicts; every file is read again", zap.String("path", path), zap.Error(err))
		return known
	}
	for p, e := range f.Verdicts {
		known[p] = verdict{key: e.Key, size: e.Size, mtime: e.MTime, msgs: e.Msgs, at: e.At}
	}
	return known
}

// saveVerdicts replaces the file at path with known, atomically and durably: a temporary
// file, fsynced, renamed over it, and the directory fsynced, so that a crash leaves the
// old verdicts or the new ones, never a torn file.
func saveVerdicts(path string, known map[string]verdict) (err error) {
	f := verdictsFile{Version: verdictsVersion, Verdicts: make(map[string]verdictEntry, len(known))}
	for p, v := range known {
		f.Verdicts[p] = verdictEntry{Key: v.key, Size: v.size, MTime: v.mtime, Msgs: v.msgs, At: v.at}
	}
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode verification verdicts: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("save verification verdicts: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(b); err != nil {
		return fmt.Errorf("save verification verdicts to %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save verification verdicts: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
