package nvidia

import (
	"strconv"
	"strings"
)

// MIG (Multi-Instance GPU) cuts an A100 or H100 into up to seven GPU
// instances, each with its own compute slices (of 7) and memory slices
// (of 8). Which instances a GPU offers is fixed by its model; the tables
// below are NVIDIA's ("Supported MIG Profiles", NVIDIA Multi-Instance GPU
// User Guide: the A100-SXM4-40GB and H100 tables, and the A100 80GB
// names), as nvidia-smi mig -lgip lists them. The +me profiles (media
// extensions, one per GPU) take the same slices as their plain profile
// and are left out.

// MIGProfile is one GPU instance profile.
type MIGProfile struct {
	// Name is the profile's name, such as "1g.10gb".
	Name string
	// ComputeSlices and MemorySlices are what one instance takes.
	ComputeSlices, MemorySlices int
	// Instances is how many instances of the profile fit the GPU at
	// most (nvidia-smi mig -lgip's "Instances Total").
	Instances int
}

// MIGLayout is how a GPU model partitions.
type MIGLayout struct {
	// ComputeSlices and MemorySlices are the GPU's totals.
	ComputeSlices, MemorySlices int
	// Profiles are the GPU instance profiles, smallest first.
	Profiles []MIGProfile
}

// migProfiles builds the profile list of a layout with 7 compute and 8
// memory slices: names are "<compute>g.<memory of the instance>gb".
func migProfiles(sliceGB int) []MIGProfile {
	name := func(c, m int) string {
		return strconv.Itoa(c) + "g." + strconv.Itoa(m*sliceGB) + "gb"
	}
	return []MIGProfile{
		{Name: name(1, 1), ComputeSlices: 1, MemorySlices: 1, Instances: 7},
		{Name: name(1, 2), ComputeSlices: 1, MemorySlices: 2, Instances: 4},
		{Name: name(2, 2), ComputeSlices: 2, MemorySlices: 2, Instances: 3},
		{Name: name(3, 4), ComputeSlices: 3, MemorySlices: 4, Instances: 2},
		{Name: name(4, 4), ComputeSlices: 4, MemorySlices: 4, Instances: 1},
		{Name: name(7, 8), ComputeSlices: 7, MemorySlices: 8, Instances: 1},
	}
}

// MIGLayoutOf returns the MIG layout of a GPU model, as the driver names
// it (GPU.Model, e.g. "NVIDIA H100 80GB HBM3"), and false for a model
// whose layout dpkit does not know (or that has no MIG).
func MIGLayoutOf(model string) (MIGLayout, bool) {
	m := strings.ToUpper(model)
	var sliceGB int
	switch {
	case strings.Contains(m, "H100") && strings.Contains(m, "80GB"):
		sliceGB = 10
	case strings.Contains(m, "A100") && strings.Contains(m, "80GB"):
		sliceGB = 10
	case strings.Contains(m, "A100") && strings.Contains(m, "40GB"):
		sliceGB = 5
	default:
		return MIGLayout{}, false
	}
	return MIGLayout{ComputeSlices: 7, MemorySlices: 8, Profiles: migProfiles(sliceGB)}, true
}
