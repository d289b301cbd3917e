//go:build race

package differential

// raceEnabled builds dpkit-devicemanager with the race detector when the
// test binary has it, so -race covers the manager's process too.
const raceEnabled = true
