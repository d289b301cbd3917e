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
// names), as nvidia-smi mig -lgip lists them, and the H200's as it listed
// them on an H200. The +me profiles (media
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

// migShapes are the instance shapes of a GPU with 7 compute and 8 memory
// slices, smallest first: compute slices, memory slices, instances.
var migShapes = [6][3]int{{1, 1, 7}, {1, 2, 4}, {2, 2, 3}, {3, 4, 2}, {4, 4, 1}, {7, 8, 1}}

// migProfiles builds the profile list of a layout with 7 compute and 8
// memory slices, each shape named by name.
func migProfiles(name func(compute, memory int) string) []MIGProfile {
	out := make([]MIGProfile, len(migShapes))
	for i, sh := range migShapes {
		out[i] = MIGProfile{Name: name(sh[0], sh[1]), ComputeSlices: sh[0], MemorySlices: sh[1], Instances: sh[2]}
	}
	return out
}

// h200Names are the H200's profile names, as nvidia-smi mig -lgip lists
// them on an H200 (docs/plugins/nvidia.md): its memory slices are not a
// whole number of GB.
var h200Names = map[[2]int]string{
	{1, 1}: "1g.18gb", {1, 2}: "1g.35gb", {2, 2}: "2g.35gb",
	{3, 4}: "3g.71gb", {4, 4}: "4g.71gb", {7, 8}: "7g.141gb",
}

// MIGLayoutOf returns the MIG layout of a GPU model, as the driver names
// it (GPU.Model, e.g. "NVIDIA H100 80GB HBM3"), and false for a model
// whose layout dpkit does not know (or that has no MIG).
func MIGLayoutOf(model string) (MIGLayout, bool) {
	m := strings.ToUpper(model)
	var name func(c, mem int) string
	bySlice := func(sliceGB int) func(c, mem int) string {
		return func(c, mem int) string { return strconv.Itoa(c) + "g." + strconv.Itoa(mem*sliceGB) + "gb" }
	}
	switch {
	case strings.Contains(m, "H100") && strings.Contains(m, "80GB"):
		name = bySlice(10)
	case strings.Contains(m, "A100") && strings.Contains(m, "80GB"):
		name = bySlice(10)
	case strings.Contains(m, "A100") && strings.Contains(m, "40GB"):
		name = bySlice(5)
	case strings.Contains(m, "H200"):
		name = func(c, mem int) string { return h200Names[[2]int{c, mem}] }
	default:
		return MIGLayout{}, false
	}
	return MIGLayout{ComputeSlices: 7, MemorySlices: 8, Profiles: migProfiles(name)}, true
}
