package mirror

import "testing"

// TestBufferPoolClasses: a buffer has room for what was asked and at most a fifth more;
// one handed back is empty when drawn again; a message longer than the largest class,
// and a buffer not of a class, are left to the collector.
func TestBufferPoolClasses(t *testing.T) {
	bp := newBufferPool()
	for _, n := range []int{0, 1, 1024, 1025, 2600, 3000, 40000, 65536} {
		b := bp.get(n)
		if len(*b) != 0 || cap(*b) < n || (n > 1024 && cap(*b) > n*5/4) {
			t.Errorf("get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		*b = append(*b, "x"...)
		bp.put(b)
	}
	if b := bp.get(65537); cap(*b) != 65537 {
		t.Errorf("get(65537): cap %d, want exactly that (no class)", cap(*b))
	}
	odd := make([]byte, 5, 1500)
	bp.put(&odd) // not a class: dropped
	for range 100 {
		if b := bp.get(1400); cap(*b) == 1500 || len(*b) != 0 {
			t.Fatalf("get(1400) returned a buffer of cap %d, len %d", cap(*b), len(*b))
		}
	}
}
