package bench

import (
	"flag"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
)

var flagProfileDir = flag.String("cpuprofile-dir", "", "write a CPU profile of each timed section to this directory (<case>-<side>-<run>.cpu)")

var profileRuns sync.Map // name → *int: runs profiled so far

// profile starts a CPU profile of this process (embedded servers included) for the timed
// section name, when -cpuprofile-dir is set. The returned function stops it; calling it
// again does nothing.
func profile(tb testing.TB, name string) func() {
	tb.Helper()
	if *flagProfileDir == "" {
		return func() {}
	}
	f, err := os.Create(profilePath(tb, name))
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
}

// profilePath is the next file of the profiles of name in -cpuprofile-dir.
func profilePath(tb testing.TB, name string) string {
	tb.Helper()
	if err := os.MkdirAll(*flagProfileDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	n, _ := profileRuns.LoadOrStore(name, new(int))
	run := n.(*int)
	*run++
	return filepath.Join(*flagProfileDir, name+"-"+strconv.Itoa(*run)+".cpu")
}
