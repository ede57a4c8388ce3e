//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package watcher

// watchCostPerEntry: elsewhere (Windows) a watch is per directory and costs no
// descriptor per entry.
const watchCostPerEntry = 0

// defaultWatchBudget: no known limit to budget against; refusals still lower it.
func defaultWatchBudget() (int, string) { return 0, "" }
