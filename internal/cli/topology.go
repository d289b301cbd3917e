package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/pkg/topology"
)

// DefaultSysfsRoot is where the machine's sysfs is mounted.
const DefaultSysfsRoot = "/sys"

// Topology holds the topology manager flags of the commands that run an
// emulated kubelet ("dpkit kubelet", "dpkit up").
type Topology struct {
	Policy string
	Scope  string
	// NUMANodes are the machine's NUMA node IDs as --numa-nodes gives
	// them; nil when the flag is not given, and then they are read from
	// SysfsRoot, as the kubelet reads them.
	NUMANodes []int
	SysfsRoot string
}

// AddFlags adds --topology-policy, --topology-scope, --numa-nodes and
// --sysfs-root to cmd, with shell completion of their values.
func (t *Topology) AddFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&t.Policy, "topology-policy", topology.PolicyNone, "topology manager policy: "+orList(topology.Policies()))
	fl.StringVar(&t.Scope, "topology-scope", topology.ScopeContainer, "topology manager scope: "+orList(scopes))
	fl.IntSliceVar(&t.NUMANodes, "numa-nodes", nil, "NUMA node IDs of the machine, e.g. 0,1 (default: read from <sysfs-root>/devices/system/node)")
	fl.StringVar(&t.SysfsRoot, "sysfs-root", DefaultSysfsRoot, "where sysfs is mounted; the NUMA nodes are read below it unless --numa-nodes is given")
	_ = cmd.RegisterFlagCompletionFunc("topology-policy", cobra.FixedCompletions(topology.Policies(), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("topology-scope", cobra.FixedCompletions(scopes, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("numa-nodes", cobra.NoFileCompletions)
	_ = cmd.MarkFlagDirname("sysfs-root")
}

var scopes = []string{topology.ScopeContainer, topology.ScopePod}

// Validate returns a usage error (exit 2) naming the flag and its valid
// values when a flag has a value that is not one.
func (t *Topology) Validate() error {
	if !slices.Contains(topology.Policies(), t.Policy) {
		return Exit(2, fmt.Errorf("--topology-policy: %q is not a topology manager policy; use %s", t.Policy, orList(topology.Policies())))
	}
	if !slices.Contains(scopes, t.Scope) {
		return Exit(2, fmt.Errorf("--topology-scope: %q is not a topology manager scope; use %s", t.Scope, orList(scopes)))
	}
	for _, n := range t.NUMANodes {
		if n < 0 {
			return Exit(2, fmt.Errorf("--numa-nodes: %d is not a NUMA node ID; IDs are 0 or more, e.g. --numa-nodes 0,1", n))
		}
	}
	if t.SysfsRoot == "" {
		return Exit(2, fmt.Errorf("--sysfs-root must not be empty; leave it out for %s", DefaultSysfsRoot))
	}
	return nil
}

// orList writes values as "a, b or c".
func orList(values []string) string {
	if len(values) < 2 {
		return strings.Join(values, "")
	}
	return strings.Join(values[:len(values)-1], ", ") + " or " + values[len(values)-1]
}
