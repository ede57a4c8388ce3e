package bench

import (
	"testing"
)

// BenchmarkBackfill is item 1 of the suite: -sessions × -entries realistic lines (see
// lineSize) mirrored from start to fully acknowledged, against raw async publishing of
// exactly the same messages on a fresh server of the same kind. Target ratio ≥ 0.8.
func BenchmarkBackfill(b *testing.B) {
	w := getWorkload(b, backfillSpec(*flagSessions, *flagEntries))
	benchBackfill(b, "backfill", w, 1)
}

// BenchmarkBackfillSmall is issue 2's back-fill: -small-sessions × -small-entries.
// Target ratio ≥ 0.6.
func BenchmarkBackfillSmall(b *testing.B) {
	w := getWorkload(b, backfillSpec(*flagSmallSess, *flagSmallEntries))
	benchBackfill(b, "backfill-small", w, 1)
}

// BenchmarkBackfillCluster is item 7: the back-fill of item 1 against a 3-node cluster
// on loopback with R3 stream, buckets and object store, as a ratio to raw R3 publishing.
func BenchmarkBackfillCluster(b *testing.B) {
	n := *flagClusterSess
	if n == 0 {
		n = *flagSessions
	}
	w := getWorkload(b, backfillSpec(n, *flagEntries))
	benchBackfill(b, "backfill-cluster", w, 3)
}

func benchBackfill(b *testing.B, name string, w *workload, replicas int) {
	var sum backfillResult
	for range b.N {
		r := runBackfill(b, name, w, replicas, *flagWindow)
		sum.pisync += r.pisync
		sum.raw += r.raw
		sum.others += r.others
	}
	sum.others /= float64(b.N)
	sum.pisync /= timeDiv(b.N)
	sum.raw /= timeDiv(b.N)
	reportBackfill(b, w, sum)
	reportWorkload(b, w)
}
