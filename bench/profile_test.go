package bench

import (
	"flag"
	"fmt"
	"io"
	"net/http"
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

var flagServerProfile = flag.String("server-profile", "", "case 10: write CPU profiles of the standalone nats-server during each side to this directory (server-<side>-<run>-<part>.cpu, one a second: `go tool pprof` merges the parts), and its heap after each part (.heap)")

// serverProfile profiles the standalone nats-server listening for pprof on port
// (prof_port) in one-second parts, back to back, until the returned function is called,
// which waits for the part under way: the Go profiler's HTTP endpoint only profiles for
// a set number of seconds, and a side's duration is not known in advance. After each
// part it takes the server's heap profile (the live heap as of the last collection:
// what the server holds, while the side runs). Nothing when -server-profile is not set.
func serverProfile(tb testing.TB, port int, side string) func() {
	tb.Helper()
	if *flagServerProfile == "" || port == 0 {
		return func() {}
	}
	if err := os.MkdirAll(*flagServerProfile, 0o755); err != nil {
		tb.Fatal(err)
	}
	n, _ := profileRuns.LoadOrStore("server-"+side, new(int))
	run := n.(*int)
	*run++
	prefix := filepath.Join(*flagServerProfile, "server-"+side+"-"+strconv.Itoa(*run))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for part := 1; ; part++ {
			select {
			case <-stop:
				return
			default:
			}
			b, err := httpGet(http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=1", port))
			if err == nil {
				err = os.WriteFile(prefix+"-"+strconv.Itoa(part)+".cpu", b, 0o644)
			}
			if err == nil {
				b, err = httpGet(http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", port))
			}
			if err == nil {
				err = os.WriteFile(prefix+"-"+strconv.Itoa(part)+".heap", b, 0o644)
			}
			if err != nil {
				tb.Logf("server profile %s: %v", side, err)
				return
			}
		}
	}()
	var once sync.Once
	stopProfile := func() { once.Do(func() { close(stop); <-done }) }
	tb.Cleanup(stopProfile) // a side that fails ends it too
	return stopProfile
}

// httpGet is the body of a 200 response to GET url through c.
func httpGet(c *http.Client, url string) ([]byte, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}
