//go:build !amd64 || purego

package session

// useSIMD is false: only amd64 has an assembly string scan.
const useSIMD = false

func scanStringSIMD(b []byte, i int) (end int, esc bool, err error) {
	return scanStringSWAR(b, i)
}
