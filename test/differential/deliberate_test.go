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
	// diverges ends the scenario at this step: the sides' states differ
	// from here on.
	diverges bool
}

var deliberate = []deliberateDiff{
	{
		scenario: "adm-empty-answer",
		step:     "admit p2 (main example.com/a=4)",
		issue:    "kubernetes#130172",
		summary:  "an Allocate answer without container responses fails admission; the kubelet keeps the devices it reserved for it, dpkit releases them",
		upstream: []string{"admit p2: rejected UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable for example.com/a. Requested: 4, Available: 2, which is unexpected"},
		dpkit: []string{
			"admit p2: admitted",
			"  main: example.com/a=[a0 a1 a2 a3]",
			"p: GetPreferredAllocation(available=[a0 a1 a2 a3] mustInclude=[] size=4)",
			"p: Allocate[a0 a1 a2 a3]",
		},
		diverges: true,
	},
	{
		scenario: "adm-partial-failure",
		step:     "checkpoint",
		issue:    "kubernetes#56307",
		summary:  "a pod rejected at its second container keeps its first container's devices in the kubelet (and its checkpoint) until the next admission collects inactive pods; dpkit rolls the whole admission back",
		upstream: []string{
			"checkpoint registered example.com/a=[a0 a1 a2 a3]",
			"checkpoint entry uid-p1/c1 example.com/a -1=[a0] {env DEVICES_A=a0; annotation example.com/a-devices=a0; mount /run/a<-/var/run/fake/a ro=true; device /dev/a/a0<-/dev/fake-a-a0 rw; cdi example.com/a=a0}",
		},
		dpkit: []string{"checkpoint registered example.com/a=[a0 a1 a2 a3]"},
	},
	{
		scenario: "adm-zero-plugin-gone",
		step:     "admit p1 (main example.com/a=0)",
		issue:    "kubernetes#128854",
		summary:  "a container asking for zero devices of a resource without healthy devices is rejected by the kubelet; dpkit skips zero requests",
		upstream: []string{"admit p1: rejected UnexpectedAdmissionError: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices example.com/a, which is unexpected"},
		dpkit:    []string{"admit p1: admitted", "  main: no devices"},
		diverges: true,
	},
	{
		scenario: "reg-old-instance-lists",
		step:     "capacity becomes example.com/a=3/3",
		issue:    "kubernetes#127803",
		summary:  "the newest instance of a resource's plugin takes over; the kubelet still applies the lists of the older one, which overwrite the new one's devices, dpkit ignores them",
		upstream: []string{"capacity example.com/a=3/3"},
		dpkit:    []string{"TIMEOUT: capacity did not become example.com/a=3/3 within 10s; last: example.com/a=2/2"},
	},
	{
		scenario: "reg-same-socket",
		step:     "capacity becomes example.com/a=3/0",
		issue:    "kubernetes#139338",
		summary:  "a refused registration of a connected socket path makes the kubelet forget the path's live connection, so when that plugin stops its devices stay allocatable (until the kubelet restarts); dpkit keeps the connection and marks them unhealthy",
		upstream: []string{"TIMEOUT: capacity did not become example.com/a=3/0 within 10s; last: example.com/a=3/2"},
		dpkit:    []string{"capacity example.com/a=3/0"},
	},
}

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
