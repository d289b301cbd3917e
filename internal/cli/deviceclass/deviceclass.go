// Package deviceclass implements "dpkit deviceclass": it prints the
// DeviceClass objects that select the devices of a PluginConfig's DRA
// drivers, one per resource with the dra front (every resource with
// --all), for kubectl apply.
package deviceclass

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/config"
)

// The documents are built from plain structs with resource.k8s.io/v1's
// field names: the dpkit binary, the lean plugin image's included, links
// no k8s.io/api package.

// deviceClass is a resource.k8s.io/v1 DeviceClass.
type deviceClass struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   metadata        `json:"metadata"`
	Spec       deviceClassSpec `json:"spec"`
}

type metadata struct {
	Name string `json:"name"`
}

type deviceClassSpec struct {
	Selectors []selector `json:"selectors"`
	// ExtendedResourceName makes pods that ask for the extended resource
	// get their devices through DRA (DRAExtendedResource).
	ExtendedResourceName string `json:"extendedResourceName,omitempty"`
}

type selector struct {
	CEL celSelector `json:"cel"`
}

type celSelector struct {
	Expression string `json:"expression"`
}

// list is what -o json prints: a v1 List, as kubectl get -o json does.
type list struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Items      []deviceClass `json:"items"`
}

// NewCommand returns the "deviceclass" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var (
		path, format string
		all, noExt   bool
	)
	cmd := &cobra.Command{
		Use:   "deviceclass --config FILE",
		Short: "Print the DeviceClasses of a plugin config's DRA drivers",
		Long: `Print a DeviceClass (resource.k8s.io/v1) for every resource of a PluginConfig
served with the dra front: named after the resource's device class name
(default the driver name, gpu.nvidia.com for nvidia.com/gpu), selecting the
driver's devices, and with extendedResourceName set to the resource, so
that pods asking for the extended resource get its devices through DRA.
A resource whose devices include partitions (nvidia mig: partitions, fake
partitions) gets two: the class of all its devices, for claims, and
<class>-whole, its whole devices, which carries extendedResourceName, so
that a pod asking the extended resource gets a whole device.
With --all, every resource of the config gets one, whatever its fronts:
for moving a device plugin's users to DRA. With --no-extended-resource the
classes leave extendedResourceName out: kubelets before v1.36 run a pod the
scheduler served that way without its device.

YAML documents (kubectl apply -f -), or a List with -o json.`,
		Example: `  dpkit deviceclass --config examples/nvidia-dra.yaml | kubectl apply -f -
  dpkit deviceclass --config examples/nvidia.yaml --all
  dpkit deviceclass --config gpu.yaml -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadPluginConfig(path, "--config")
			if err != nil {
				return cli.Exit(cli.ExitUsage, err)
			}
			var items []deviceClass
			for _, rf := range cfg.Fronts() {
				if all || rf.Has(config.FrontDRA) {
					for _, dc := range build(rf) {
						if noExt {
							dc.Spec.ExtendedResourceName = ""
						}
						items = append(items, dc)
					}
				}
			}
			if len(items) == 0 {
				if _, err := fmt.Fprintf(env.Err, "No resource of %s has the dra front, so it has no DeviceClass; add dra to a plugin entry's fronts, or use --all to print one for every resource.\n", path); err != nil {
					return err
				}
			}
			return write(env.Out, format, items)
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "PluginConfig file (required), e.g. examples/nvidia-dra.yaml")
	cmd.Flags().BoolVar(&all, "all", false, "a DeviceClass for every resource, whatever its fronts")
	cmd.Flags().BoolVar(&noExt, "no-extended-resource", false, "leave extendedResourceName out: pods asking for the extended resource are not served through DRA (for clusters with kubelets older than v1.36, which would run such pods without their device)")
	output.AddFlag(cmd, &format, "yaml", "json")
	return cmd
}

// WholeSuffix ends the name of the DeviceClass of a partitioned
// resource's whole devices.
const WholeSuffix = "-whole"

// build returns the DeviceClasses of one resource: one selecting the
// driver's devices, with extendedResourceName. A partitioned resource
// gets two: the driver's devices (partitions included, for claims), and
// <class>-whole, its whole devices only, with extendedResourceName, so
// that a pod asking the extended resource gets a whole device.
func build(rf config.ResourceFront) []deviceClass {
	class := func(name, expr, ext string) deviceClass {
		return deviceClass{
			APIVersion: "resource.k8s.io/v1",
			Kind:       "DeviceClass",
			Metadata:   metadata{Name: name},
			Spec: deviceClassSpec{
				Selectors:            []selector{{CEL: celSelector{Expression: expr}}},
				ExtendedResourceName: ext,
			},
		}
	}
	driver := "device.driver == " + strconv.Quote(rf.DriverName)
	if !rf.Partitioned {
		return []deviceClass{class(rf.DeviceClass, driver, rf.Resource)}
	}
	whole := driver + " && device.attributes[" + strconv.Quote(rf.DriverName) + "].partition == false"
	return []deviceClass{class(rf.DeviceClass, driver, ""), class(rf.DeviceClass+WholeSuffix, whole, rf.Resource)}
}

// write prints items as YAML documents, or as a JSON List.
func write(w io.Writer, format string, items []deviceClass) error {
	if format == "json" {
		if items == nil {
			items = []deviceClass{}
		}
		b, err := json.MarshalIndent(list{APIVersion: "v1", Kind: "List", Items: items}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	for i, dc := range items {
		b, err := yaml.Marshal(dc)
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
