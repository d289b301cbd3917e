//go:build !race

package differential

const raceEnabled = false
