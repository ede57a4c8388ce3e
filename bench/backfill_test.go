// Package bench measures pisync against raw JetStream publishing in the same run, so that
// every figure is a ratio to the ceiling on the machine at hand. See README.md.
package bench

import (
	"os"
	"testing"
	"time"
)

const window = 1024

// BenchmarkBackfill mirrors the back-fill workload from start to fully acknowledged, and
// publishes exactly the same payloads and headers raw on a fresh server of the same kind,
// reporting both throughputs and their ratio.
func BenchmarkBackfill(b *testing.B) {
	w := backfillWorkload(b)
	var rawTime, pisyncTime time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		srv, _, js := server(b)
		b.StartTimer()
		start := time.Now()
		rawPublish(b, js, w, window)
		rawTime += time.Since(start)
		b.StopTimer()
		srv.Stop()

		_, nc, _ := server(b)
		b.StartTimer()
		start = time.Now()
		pisyncBackfill(b, nc, w, window)
		pisyncTime += time.Since(start)
	}
	n := float64(b.N)
	rawSec, pisyncSec := rawTime.Seconds()/n, pisyncTime.Seconds()/n
	b.ReportMetric(float64(w.lines)/pisyncSec, "entries/s")
	b.ReportMetric(float64(w.bytes)/pisyncSec/1e6, "MB/s")
	b.ReportMetric(float64(w.lines)/rawSec, "raw-entries/s")
	b.ReportMetric(float64(w.bytes)/rawSec/1e6, "raw-MB/s")
	b.ReportMetric(rawSec/pisyncSec, "ratio")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if theWorkload.root != "" {
		os.RemoveAll(theWorkload.root)
	}
	os.Exit(code)
}
