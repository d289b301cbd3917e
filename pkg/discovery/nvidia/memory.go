package nvidia

import (
	"regexp"
	"strconv"
)

// memoryRE finds the memory size a model name carries: "NVIDIA H100 80GB
// HBM3", "NVIDIA A100-SXM4-40GB", "Tesla V100-PCIE-16GB".
var memoryRE = regexp.MustCompile(`(?i)(?:^|[^0-9a-z])([0-9]{1,4})GB(?:$|[^0-9a-z])`)

// knownMemory is the memory of models whose names give none, as
// nvidia-smi reported it (memory.total) on one.
var knownMemory = map[string]int64{
	"NVIDIA H200": 143771 << 20,
}

// MemoryOf returns the memory of a GPU model in bytes, as its name gives
// it, and false when the name gives none ("NVIDIA L40S", "NVIDIA GeForce
// RTX 4090") and dpkit does not know the model's (an H200's 143771Mi, as
// nvidia-smi reports it). The driver's procfs lists no memory size, so
// the name is all there is without the management library. The name's
// GB are read as GiB, as the MIG profile names (1g.10gb) read them: an
// "80GB" GPU has 80Gi.
func MemoryOf(model string) (int64, bool) {
	if v, ok := knownMemory[model]; ok {
		return v, true
	}
	m := memoryRE.FindStringSubmatch(model)
	if m == nil {
		return 0, false
	}
	gb, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || gb == 0 {
		return 0, false
	}
	return gb << 30, true
}
