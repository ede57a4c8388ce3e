//go:build !(linux && (amd64 || arm64))

package watcher

import (
	"os"
	"path/filepath"
)

// listDir touches the session files of dir and returns its subdirectories, and how many
// entries it has (for the watch budget).
func (w *Watcher) listDir(r *root, dir string, gen uint64, initial bool) (subdirs []string, n int, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch typ := e.Type(); {
		case typ.IsDir():
			subdirs = append(subdirs, p)
		case typ.IsRegular() && isSessionName(e.Name()):
			info, err := e.Info()
			if err != nil {
				continue
			}
			snap := snapOf(info)
			w.mu.Lock()
			w.touchLocked(r, p, &snap, gen, initial)
			w.mu.Unlock()
		}
	}
	return subdirs, len(entries), nil
}
