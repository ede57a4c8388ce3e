//go:build race

package publisher

const raceEnabled = true
