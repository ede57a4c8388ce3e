//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package watcher

import "syscall"

// watchCostPerEntry: fsnotify's kqueue backend opens every entry of a watched directory
// (files and subdirectories) to report its writes, one descriptor each.
const watchCostPerEntry = 1

// defaultWatchBudget leaves a quarter of the descriptor limit (at least 128) to what
// is not a watch: reading session files, the NATS connection, the HTTP server, state
// files. Go raises the soft limit to the hard one at start (on macOS capped by
// kern.maxfilesperproc), so this is read after that.
func defaultWatchBudget() (int, string) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 0, ""
	}
	cur := int(min(rl.Cur, 1<<30))
	return max(0, cur-max(128, cur/4)), "RLIMIT_NOFILE"
}
