//go:build !linux

package sysmem

import "errors"

// Unmap does nothing here (see the Linux version).
func Unmap(addr, n uintptr) error { return nil }

// ReleaseProgram does nothing here (see the Linux version).
func ReleaseProgram() error { return nil }

// Resident is not known here.
func Resident(path string) (int64, error) { return 0, errors.ErrUnsupported }
