package logx

import (
	"sync"
	"testing"
)

func TestRun(t *testing.T) {
	cases := []struct {
		every int64
		hits  int
		want  []int64 // counts logged
	}{
		{every: 0, hits: 5, want: []int64{1}},
		{every: 3, hits: 10, want: []int64{1, 3, 6, 9}},
		{every: 1, hits: 3, want: []int64{1, 2, 3}},
	}
	for _, c := range cases {
		r := Run{Every: c.every}
		for round := range 2 { // End starts a new run that logs its first again
			var logged []int64
			for range c.hits {
				if n, log := r.Hit(); log {
					logged = append(logged, n)
				}
			}
			if len(logged) != len(c.want) {
				t.Fatalf("every %d, round %d: logged %v, want %v", c.every, round, logged, c.want)
			}
			for i := range logged {
				if logged[i] != c.want[i] {
					t.Fatalf("every %d, round %d: logged %v, want %v", c.every, round, logged, c.want)
				}
			}
			if n := r.End(); n != int64(c.hits) {
				t.Fatalf("End = %d, want %d", n, c.hits)
			}
		}
	}
}

// TestRunConcurrent: hits from several goroutines log the first exactly once.
func TestRunConcurrent(t *testing.T) {
	r := Run{Every: 100}
	var mu sync.Mutex
	logged := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				if _, log := r.Hit(); log {
					mu.Lock()
					logged++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if logged != 1+2000/100 {
		t.Errorf("logged %d of 2000 hits, want %d", logged, 1+2000/100)
	}
}
