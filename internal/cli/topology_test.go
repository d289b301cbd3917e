package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestTopologyValidate(t *testing.T) {
	t.Parallel()
	ok := Topology{Policy: "single-numa-node", Scope: "pod", NUMANodes: []int{0, 1}, SysfsRoot: "/sys"}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", ok, err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Topology)
		want string
	}{
		{"policy", func(t *Topology) { t.Policy = "bogus" }, `--topology-policy: "bogus" is not a topology manager policy; use none, best-effort, restricted or single-numa-node`},
		{"scope", func(t *Topology) { t.Scope = "node" }, `--topology-scope: "node" is not a topology manager scope; use container or pod`},
		{"NUMA node", func(t *Topology) { t.NUMANodes = []int{0, -1} }, `--numa-nodes: -1 is not a NUMA node ID`},
		{"sysfs", func(t *Topology) { t.SysfsRoot = "" }, `--sysfs-root must not be empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := ok
			tc.edit(&o)
			err := o.Validate()
			if ExitCode(err) != 2 || err.Error() != tc.want && !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("Validate() = %v (exit %d), want exit 2 and %q", err, ExitCode(err), tc.want)
			}
		})
	}
}

func TestFlagError(t *testing.T) {
	t.Parallel()
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	cmd.Flags().Int("n", 0, "")
	cmd.SetFlagErrorFunc(FlagError)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	for _, args := range [][]string{{"--bogus"}, {"--n", "x"}} {
		cmd.SetArgs(args)
		err := cmd.Execute()
		if ExitCode(err) != 2 || !strings.HasSuffix(err.Error(), "\nSee 'x --help'.") {
			t.Errorf("%v: %v (exit %d), want exit 2 pointing to --help", args, err, ExitCode(err))
		}
	}
}
