package config

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/configfile"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/amdgpu"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
	"github.com/dpkit/dpkit/pkg/plugins/generic"
	"github.com/dpkit/dpkit/pkg/plugins/nvidia"
)

// PluginConfigKind is the kind of the file "dpkit plugin --config" reads.
const PluginConfigKind = "PluginConfig"

// PluginConfig describes the plugins one "dpkit plugin" process serves.
// Command-line flags override the fields they name.
type PluginConfig struct {
	configfile.TypeMeta `json:",inline"`
	// PluginDir is the kubelet's device plugin directory
	// (--plugin-dir). Default /var/lib/kubelet/device-plugins.
	PluginDir string `json:"pluginDir,omitempty"`
	// Registration is auto, kubelet or registry (--registration).
	Registration string `json:"registration,omitempty"`
	// RegistryDir is the kubelet's plugin watcher directory
	// (--registry-dir). Default /var/lib/kubelet/plugins_registry.
	RegistryDir string `json:"registryDir,omitempty"`
	// MetricsAddress serves /metrics, /healthz and /readyz when set
	// (--metrics-address), e.g. ":9400".
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// Host says where the host's /sys, /dev and /proc are mounted.
	Host HostConfig `json:"host,omitempty"`
	// Plugins lists the plugins to run; each entry sets exactly one kind.
	Plugins []PluginSpec `json:"plugins"`
	// DRA says where the DRA front of the entries that have it meets the
	// kubelet and the API server.
	DRA DRAConfig `json:"dra,omitempty"`
}

// HostConfig locates the host's filesystems (--sysfs-root, --dev-root,
// --proc-root).
type HostConfig struct {
	SysfsRoot string `json:"sysfsRoot,omitempty"`
	DevRoot   string `json:"devRoot,omitempty"`
	ProcRoot  string `json:"procRoot,omitempty"`
}

// PluginSpec is one plugin: exactly one of Fake, Generic, AMDGPU and
// NVIDIA is set, with the fronts that serve its resources.
type PluginSpec struct {
	// Fronts are how the plugin's resources reach the kubelet:
	// deviceplugin, dra or both. Default [deviceplugin].
	Fronts []string `json:"fronts,omitempty"`
	// DRA names the entry's DRA driver and DeviceClass (dra front only).
	DRA *PluginDRA `json:"dra,omitempty"`

	// Fake serves made-up devices for testing (docs: README, "Fake plugin").
	Fake *fake.Config `json:"fake,omitempty"`
	// Generic serves host devices: paths and globs, USB and PCI devices
	// (docs/plugins/generic.md).
	Generic *generic.Config `json:"generic,omitempty"`
	// AMDGPU serves AMD GPUs found through KFD (docs/plugins/amdgpu.md).
	AMDGPU *amdgpu.Config `json:"amdgpu,omitempty"`
	// NVIDIA serves NVIDIA GPUs found through the driver's procfs
	// (docs/plugins/nvidia.md).
	NVIDIA *nvidia.Config `json:"nvidia,omitempty"`
}

// section is what every plugin's config offers.
type section interface {
	Default()
	Validate(*field.Path) field.ErrorList
}

type kind struct {
	name      string
	cfg       section
	build     func(plugins.Options) ([]deviceplugin.Resource, error)
	resources func() []string // the resource names, from the defaulted config
}

// kinds returns the plugin kinds set in p, with how to build each.
func (p *PluginSpec) kinds() []kind {
	var out []kind
	if p.Fake != nil {
		out = append(out, kind{"fake", p.Fake, func(o plugins.Options) ([]deviceplugin.Resource, error) { return fake.New(*p.Fake, o) }, func() []string {
			names := make([]string, len(p.Fake.Resources))
			for i, r := range p.Fake.Resources {
				names[i] = r.Name
			}
			return names
		}})
	}
	if p.Generic != nil {
		out = append(out, kind{"generic", p.Generic, func(o plugins.Options) ([]deviceplugin.Resource, error) { return generic.New(*p.Generic, o) }, func() []string {
			names := make([]string, len(p.Generic.Groups))
			for i, g := range p.Generic.Groups {
				names[i] = p.Generic.ResourceName(g)
			}
			return names
		}})
	}
	if p.AMDGPU != nil {
		out = append(out, kind{"amdgpu", p.AMDGPU, func(o plugins.Options) ([]deviceplugin.Resource, error) { return amdgpu.New(*p.AMDGPU, o) }, func() []string {
			return []string{p.AMDGPU.ResourceName}
		}})
	}
	if p.NVIDIA != nil {
		out = append(out, kind{"nvidia", p.NVIDIA, func(o plugins.Options) ([]deviceplugin.Resource, error) { return nvidia.New(*p.NVIDIA, o) }, func() []string {
			return []string{p.NVIDIA.ResourceName}
		}})
	}
	return out
}

// pluginKinds lists the plugin kinds in the order PluginSpec declares them.
var pluginKinds = []string{"fake", "generic", "amdgpu", "nvidia"}

// LoadPluginConfig reads, decodes, defaults and validates the file at
// path. flag names the option the path came from, for error messages.
func LoadPluginConfig(path, flag string) (*PluginConfig, error) {
	data, err := readFile(path, flag)
	if err != nil {
		return nil, err
	}
	cfg, err := DecodePluginConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s:\n%w", flag, path, err)
	}
	return cfg, nil
}

// DecodePluginConfig decodes, defaults and validates a PluginConfig
// (configfile.Decode). Problems in the content come as
// configfile.Problems.
func DecodePluginConfig(data []byte) (*PluginConfig, error) {
	cfg := &PluginConfig{}
	if err := configfile.Decode(data, PluginConfigKind, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Copies returns a function that makes deep copies of c, each decoded
// from c's JSON form, encoded once: a fraction of the cost of decoding
// the file again (dpkit node --count gives each of its nodes its own
// copy). A copy has every field the file and the defaults set
// (TestPluginConfigCopies).
func (c *PluginConfig) Copies() (func() (*PluginConfig, error), error) {
	data, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("plugin config: %w", err)
	}
	return func() (*PluginConfig, error) {
		out := &PluginConfig{}
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("plugin config: %w", err)
		}
		return out, nil
	}, nil
}

// Default fills unset fields of every plugin.
func (c *PluginConfig) Default() {
	if c.Registration == "" {
		c.Registration = string(deviceplugin.RegistrationAuto)
	}
	for i := range c.Plugins {
		for _, k := range c.Plugins[i].kinds() {
			k.cfg.Default()
		}
	}
	c.defaultFronts()
}

// Validate reports every problem with its field path.
func (c *PluginConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	for _, d := range []struct{ name, value string }{{"pluginDir", c.PluginDir}, {"registryDir", c.RegistryDir}} {
		if d.value != "" && !filepath.IsAbs(d.value) {
			errs = append(errs, field.Invalid(field.NewPath(d.name), d.value, "must be an absolute path"))
		}
	}
	switch deviceplugin.RegistrationMode(c.Registration) {
	case deviceplugin.RegistrationAuto, deviceplugin.RegistrationKubelet, deviceplugin.RegistrationRegistry:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("registration"), c.Registration, []string{"auto", "kubelet", "registry"}))
	}
	if len(c.Plugins) == 0 {
		errs = append(errs, field.Required(field.NewPath("plugins"), "list at least one plugin, e.g. - fake: {resources: [{name: example.com/foo}]}"))
	}
	for i := range c.Plugins {
		pp := field.NewPath("plugins").Index(i)
		kinds := c.Plugins[i].kinds()
		if len(kinds) != 1 {
			errs = append(errs, field.Invalid(pp, fmt.Sprintf("%d kinds set", len(kinds)), fmt.Sprintf("set exactly one of %v per entry", pluginKinds)))
		}
		for _, k := range kinds {
			errs = append(errs, k.cfg.Validate(pp.Child(k.name))...)
		}
	}
	return append(errs, c.validateFronts()...)
}

// Built is one configured plugin, built: its kind (fake, generic, amdgpu,
// nvidia) and the resources it serves.
type Built struct {
	Kind      string
	Resources []deviceplugin.Resource
}

// Build builds every configured plugin, in the order of the file.
func (c *PluginConfig) Build(opts plugins.Options) ([]Built, error) {
	var out []Built
	for i := range c.Plugins {
		for _, k := range c.Plugins[i].kinds() {
			rs, err := k.build(opts)
			if err != nil {
				return nil, fmt.Errorf("plugins[%d].%s: %w", i, k.name, err)
			}
			out = append(out, Built{Kind: k.name, Resources: rs})
		}
	}
	return out, nil
}

// Resources builds every configured plugin's resources.
func (c *PluginConfig) Resources(opts plugins.Options) ([]deviceplugin.Resource, error) {
	built, err := c.Build(opts)
	if err != nil {
		return nil, err
	}
	var out []deviceplugin.Resource
	for _, b := range built {
		out = append(out, b.Resources...)
	}
	return out, nil
}

// Check validates c, after flags changed it, as one error: nil or
// configfile.Problems.
func (c *PluginConfig) Check() error { return configfile.Join(c.Validate()) }

// HostOptions returns the plugin options for the configured host roots.
func (c *PluginConfig) HostOptions() plugins.Options {
	return plugins.Options{SysfsRoot: c.Host.SysfsRoot, DevRoot: c.Host.DevRoot, ProcRoot: c.Host.ProcRoot}
}
