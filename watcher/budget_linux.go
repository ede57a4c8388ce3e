package watcher

import (
	"os"
	"strconv"
	"strings"
)

// watchCostPerEntry: inotify watches a directory, not its entries.
const watchCostPerEntry = 0

// defaultWatchBudget takes half of fs.inotify.max_user_watches: the limit is shared by
// every program of the user (editors and IDEs watch whole trees), and a watcher that
// took it all would break theirs. Refusals (ENOSPC) lower the budget further.
func defaultWatchBudget() (int, string) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches")
	if err != nil {
		return 0, ""
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 0, ""
	}
	return max(1, n/2), "fs.inotify.max_user_watches"
}
