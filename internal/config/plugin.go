package config

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
)

// PluginConfigKind is the kind of the file "dpkit plugin --config" reads.
const PluginConfigKind = "PluginConfig"

// PluginConfig describes the plugins one "dpkit plugin" process serves.
// Command-line flags override the fields they name.
type PluginConfig struct {
	TypeMeta `json:",inline"`
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
}

// HostConfig locates the host's filesystems (--sysfs-root, --dev-root,
// --proc-root).
type HostConfig struct {
	SysfsRoot string `json:"sysfsRoot,omitempty"`
	DevRoot   string `json:"devRoot,omitempty"`
	ProcRoot  string `json:"procRoot,omitempty"`
}

// PluginSpec is one plugin. Exactly one field is set.
type PluginSpec struct {
	Fake *fake.Config `json:"fake,omitempty"`
}

// pluginKinds lists the plugin kinds in the order PluginSpec declares them.
var pluginKinds = []string{"fake"}

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

// DecodePluginConfig decodes, defaults and validates a PluginConfig.
func DecodePluginConfig(data []byte) (*PluginConfig, error) {
	cfg := &PluginConfig{}
	if err := decodeStrict(data, PluginConfigKind, cfg); err != nil {
		return nil, err
	}
	cfg.Default()
	if err := fieldErrors(cfg.Validate()); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Default fills unset fields of every plugin.
func (c *PluginConfig) Default() {
	if c.Registration == "" {
		c.Registration = string(deviceplugin.RegistrationAuto)
	}
	for i := range c.Plugins {
		if f := c.Plugins[i].Fake; f != nil {
			f.Default()
		}
	}
}

// Validate reports every problem with its field path.
func (c *PluginConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	switch deviceplugin.RegistrationMode(c.Registration) {
	case deviceplugin.RegistrationAuto, deviceplugin.RegistrationKubelet, deviceplugin.RegistrationRegistry:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("registration"), c.Registration, []string{"auto", "kubelet", "registry"}))
	}
	if len(c.Plugins) == 0 {
		errs = append(errs, field.Required(field.NewPath("plugins"), "list at least one plugin, e.g. - fake: {resources: [{name: example.com/foo}]}"))
	}
	names := map[string]string{}
	for i, p := range c.Plugins {
		pp := field.NewPath("plugins").Index(i)
		set := 0
		if p.Fake != nil {
			set++
			errs = append(errs, p.Fake.Validate(pp.Child("fake"))...)
			for j, r := range p.Fake.Resources {
				rp := pp.Child("fake", "resources").Index(j).Child("name").String()
				if prev, dup := names[r.Name]; dup {
					errs = append(errs, field.Duplicate(field.NewPath(rp), fmt.Sprintf("%s (also at %s)", r.Name, prev)))
				}
				names[r.Name] = rp
			}
		}
		if set != 1 {
			errs = append(errs, field.Invalid(pp, fmt.Sprintf("%d kinds set", set), fmt.Sprintf("set exactly one of %v", pluginKinds)))
		}
	}
	return errs
}

// Resources builds every configured plugin's resources.
func (c *PluginConfig) Resources(opts plugins.Options) ([]deviceplugin.Resource, error) {
	var out []deviceplugin.Resource
	for i, p := range c.Plugins {
		var (
			rs  []deviceplugin.Resource
			err error
		)
		switch {
		case p.Fake != nil:
			rs, err = fake.New(*p.Fake, opts)
		}
		if err != nil {
			return nil, fmt.Errorf("plugins[%d]: %w", i, err)
		}
		out = append(out, rs...)
	}
	return out, nil
}

// Check validates c, after flags changed it, as one error.
func (c *PluginConfig) Check() error { return fieldErrors(c.Validate()) }

// HostOptions returns the plugin options for the configured host roots.
func (c *PluginConfig) HostOptions() plugins.Options {
	return plugins.Options{SysfsRoot: c.Host.SysfsRoot, DevRoot: c.Host.DevRoot, ProcRoot: c.Host.ProcRoot}
}
