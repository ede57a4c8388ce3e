package main

import (
	"math"
	"strings"
	"testing"
)

// TestParse reads go test -bench output: names without the GOMAXPROCS suffix, values
// in the units the benchmark reported (MB/s stays MB/s), the machine's configuration,
// and a line broken by the benchmark's own output skipped.
func TestParse(t *testing.T) {
	in := `cpu: Some CPU   
goos: linux
BenchmarkBackfill-2   	 1	35376620541 ns/op	 112.61 MB/s	 42161 entries/s	 0.8131 ratio
BenchmarkBackfill-2   	 1	23283583679 ns/op	 113.58 MB/s	 42523 entries/s	 0.9115 ratio
BenchmarkScaling/files=1000-2 	 1	 5 ns/op	 1.5 discovery-s
BenchmarkIdle/defaults-2	some output of the benchmark
ok  	github.com/pisync/pisync/bench	60.0s
`
	res, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.order, " "); got != "Backfill Scaling/files=1000" {
		t.Errorf("benchmarks %q", got)
	}
	if got := res.runs["Backfill"]["MB/s"]; len(got) != 2 || got[0] != 112.61 || got[1] != 113.58 {
		t.Errorf("MB/s %v", got)
	}
	if got := res.runs["Backfill"]["ratio"]; len(got) != 2 || got[1] != 0.9115 {
		t.Errorf("ratio %v", got)
	}
	if res.config["cpu"] != "Some CPU" || res.config["goos"] != "linux" {
		t.Errorf("config %v", res.config)
	}
}

// TestStats: the median always; the spread is the 95% interval of the median from 6
// runs on, and the lowest to highest run below that.
func TestStats(t *testing.T) {
	for _, tc := range []struct {
		name          string
		vs            []float64
		med, lo, hi   float64
		narrowerThanR bool // the interval is inside the range of the runs
	}{
		{"one run", []float64{7}, 7, 7, 7, false},
		{"three runs", []float64{3, 1, 2}, 2, 1, 3, false},
		{"four runs", []float64{4, 1, 3, 2}, 2.5, 1, 4, false},
		{"twelve runs", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 100}, 6.5, 0, 0, true},
	} {
		med, lo, hi := stats(tc.vs)
		if med != tc.med {
			t.Errorf("%s: median %v, want %v", tc.name, med, tc.med)
		}
		if tc.narrowerThanR {
			if !(lo > 1 && hi < 100 && lo <= med && med <= hi) {
				t.Errorf("%s: interval %v – %v, want one inside 1 – 100 around %v", tc.name, lo, hi, med)
			}
			continue
		}
		if lo != tc.lo || hi != tc.hi {
			t.Errorf("%s: spread %v – %v, want %v – %v", tc.name, lo, hi, tc.lo, tc.hi)
		}
	}
	if med, lo, hi := stats(nil); !math.IsNaN(med) || !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Error("no runs: want NaN")
	}
}
