package differential

// deliberateDiff is a difference between the kubelet's device manager
// (v1.37) and dpkit's that is on purpose: dpkit fixes an upstream bug. The
// observations of both sides at that step must be exactly these, so a
// change on either side is noticed. The same table is in
// docs/device-manager.md ("Differential suite").
type deliberateDiff struct {
	scenario string
	step     string // the step's description (step.what)
	issue    string // kubernetes#N
	summary  string
	upstream []string
	dpkit    []string
}

var deliberate = []deliberateDiff{}

// deliberateFor returns the deliberate differences of one scenario by
// step.
func deliberateFor(scenario string) map[string]deliberateDiff {
	out := map[string]deliberateDiff{}
	for _, d := range deliberate {
		if d.scenario == scenario {
			out[d.step] = d
		}
	}
	return out
}
