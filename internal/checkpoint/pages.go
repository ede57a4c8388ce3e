package checkpoint

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ReleasePages hands unmap the range of the database's mapping, for it to drop the pages
// this process holds from its memory (the caller knows how: the store uses no system
// call of its own). bbolt reads through a shared, read-only mapping of the file: every
// record that the start and a back-fill read or updated stayed resident in the daemon
// (12 MB for 10,000 files), although an idle daemon reads none of them. The pages are
// clean copies of the file, so nothing is lost: a later read maps them again. Meant for
// when the daemon has gone quiet.
func (s *Store) ReleasePages(unmap func(addr, n uintptr) error) error {
	// Inside a read transaction bbolt cannot remap the file (that takes its mmap lock
	// exclusively), so the range is the database's mapping and nothing else.
	err := s.db.View(func(tx *bolt.Tx) error {
		return unmap(s.db.Info().Data, uintptr(tx.Size()))
	})
	if err != nil {
		return fmt.Errorf("release the pages of %s: %w", s.path, err)
	}
	return nil
}
