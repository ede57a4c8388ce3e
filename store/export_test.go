package store

// SetForkCopyFault makes the copy of a fork's n-th entry fail with what f returns, as a
// replica dying mid-copy or JetStream refusing the publish would (nil: never fails).
func SetForkCopyFault(s *Store, f func(n int) error) {
	if f == nil {
		s.faults.forkCopy.Store(nil)
		return
	}
	s.faults.forkCopy.Store(&f)
}
