package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// Fronts: how a plugin's resources reach the kubelet.
const (
	// FrontDevicePlugin serves the resource through the device plugin API
	// (v1beta1): the kubelet's device manager.
	FrontDevicePlugin = "deviceplugin"
	// FrontDRA serves it as a DRA driver: a ResourceSlice with the
	// devices' attributes, and NodePrepareResources for the claims.
	FrontDRA = "dra"
)

// frontNames are the valid fronts, in the order they are listed.
var frontNames = []string{FrontDevicePlugin, FrontDRA}

// Defaults of the dra section.
const (
	DefaultDRAPluginsDir      = "/var/lib/kubelet/plugins"
	DefaultCDIDir             = "/var/run/cdi"
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// EnvNodeName is the variable the node name comes from when
	// dra.nodeName is not set (the downward API's spec.nodeName).
	EnvNodeName = "NODE_NAME"
	// EnvPodUID is the variable with the UID of the pod the plugin runs
	// in (the downward API's metadata.uid): set, the DRA front takes part
	// in rolling updates of its DaemonSet (maxSurge 1).
	EnvPodUID = "POD_UID"
	// EnvDRAPluginsDir and EnvCDIDir name the plugins and CDI
	// directories when dra.pluginsDir and dra.cdiDir are left at their
	// defaults (dpkit verify --dra sets them).
	EnvDRAPluginsDir = "DPKIT_DRA_PLUGINS_DIR"
	EnvCDIDir        = "DPKIT_CDI_DIR"
	// maxDriverNameLength is resource.k8s.io/v1's DriverNameMaxLength.
	maxDriverNameLength = 63
	nameExample         = "e.g. gpu.example.com"
)

// DRAConfig is the top-level dra section: where the DRA front of every
// plugin entry with the dra front meets the kubelet and the API server.
type DRAConfig struct {
	// PluginsDir is the kubelet's plugins directory, where each DRA
	// driver's socket lives (<pluginsDir>/<driver>/dra.sock). Default
	// /var/lib/kubelet/plugins.
	PluginsDir string `json:"pluginsDir,omitempty"`
	// CDIDir is where the DRA front writes the CDI specs of prepared
	// claims (the container runtime's CDI directory). Default /var/run/cdi.
	CDIDir string `json:"cdiDir,omitempty"`
	// NodeName is the node the ResourceSlices are published for. Default:
	// $NODE_NAME, read when the front starts.
	NodeName string `json:"nodeName,omitempty"`
	// Kubeconfig is the API server client configuration file; default the
	// in-cluster configuration (internal/kubeconfig.Load).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// PodResourcesSocket is the kubelet's PodResources socket. Default
	// /var/lib/kubelet/pod-resources/kubelet.sock.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
}

// PluginDRA is a plugin entry's dra section: the names its DRA front uses.
type PluginDRA struct {
	// DriverName is the DRA driver name; default resourcename.DriverName
	// of the resource (gpu.nvidia.com for nvidia.com/gpu). Only for an
	// entry that serves one resource.
	DriverName string `json:"driverName,omitempty"`
	// DeviceClass is the name of the DeviceClass that selects the
	// driver's devices; default the driver name. Only for an entry that
	// serves one resource.
	DeviceClass string `json:"deviceClass,omitempty"`
}

// ResourceFront is one resource of the config and how it is served.
type ResourceFront struct {
	// Kind is the plugin kind that serves it: fake, generic, amdgpu or
	// nvidia.
	Kind string `json:"kind"`
	// Resource is the extended resource name.
	Resource string `json:"resource"`
	// Fronts are the fronts that serve it (deviceplugin, dra).
	Fronts []string `json:"fronts"`
	// DriverName and DeviceClass are the DRA driver and DeviceClass names
	// it has, or would have with the dra front.
	DriverName  string `json:"driverName"`
	DeviceClass string `json:"deviceClass"`
	// Partitioned is set when the resource's DRA devices include
	// partitions of its devices (the attribute partition tells them
	// apart): its DeviceClass selects whole devices, so that a pod asking
	// the extended resource gets a whole one.
	Partitioned bool `json:"partitioned,omitempty"`
}

// Has reports whether front serves the resource.
func (r ResourceFront) Has(front string) bool { return slices.Contains(r.Fronts, front) }

// Fronts lists every resource of the config, in the order of the file,
// with its fronts and DRA names. c must have been defaulted.
func (c *PluginConfig) Fronts() []ResourceFront {
	var out []ResourceFront
	for i := range c.Plugins {
		out = append(out, c.Plugins[i].fronts()...)
	}
	return out
}

// fronts lists the resources of one entry with their fronts and names.
func (p *PluginSpec) fronts() []ResourceFront {
	var out []ResourceFront
	for _, k := range p.kinds() {
		for _, name := range k.resources() {
			rf := ResourceFront{Kind: k.name, Resource: name, Fronts: slices.Clone(p.Fronts), DriverName: resourcename.DriverName(name)}
			if p.DRA != nil && p.DRA.DriverName != "" {
				rf.DriverName = p.DRA.DriverName
			}
			rf.DeviceClass = rf.DriverName
			if p.DRA != nil && p.DRA.DeviceClass != "" {
				rf.DeviceClass = p.DRA.DeviceClass
			}
			rf.Partitioned = p.partitioned(name)
			out = append(out, rf)
		}
	}
	return out
}

// partitioned reports whether resource's devices include partitions.
func (p *PluginSpec) partitioned(resource string) bool {
	if p.NVIDIA != nil && p.NVIDIA.MIG != "" {
		return true
	}
	if p.Fake != nil {
		for _, r := range p.Fake.Resources {
			if r.Name == resource && len(r.Partitions) > 0 {
				return true
			}
		}
	}
	return false
}

// Dirs returns the plugins and CDI directories of the DRA front:
// dra.pluginsDir and dra.cdiDir, or, where they are at their defaults,
// $DPKIT_DRA_PLUGINS_DIR and $DPKIT_CDI_DIR when set (getenv).
func (d DRAConfig) Dirs(getenv func(string) string) (pluginsDir, cdiDir string) {
	r := d.Resolve(getenv, "")
	return r.PluginsDir, r.CDIDir
}

// Resolve returns d with the directories the DRA front uses: each field
// set in the file; else, for the plugins and CDI directories,
// $DPKIT_DRA_PLUGINS_DIR and $DPKIT_CDI_DIR (getenv); else, when the device
// plugin directory pluginDir is another than the kubelet's (a dpkit node's
// or dpkit up's root), the plugins directory and PodResources socket
// beside it, as the registry directory is; else the kubelet's.
func (d DRAConfig) Resolve(getenv func(string) string, pluginDir string) DRAConfig {
	root := ""
	if pluginDir != "" && filepath.Clean(pluginDir) != filepath.Clean(kubeletPluginDir) {
		root = filepath.Dir(filepath.Clean(pluginDir))
	}
	if d.PluginsDir == DefaultDRAPluginsDir {
		if v := getenv(EnvDRAPluginsDir); v != "" {
			d.PluginsDir = v
		} else if root != "" {
			d.PluginsDir = filepath.Join(root, filepath.Base(DefaultDRAPluginsDir))
		}
	}
	if v := getenv(EnvCDIDir); v != "" && d.CDIDir == DefaultCDIDir {
		d.CDIDir = v
	}
	if d.PodResourcesSocket == DefaultPodResourcesSocket && root != "" {
		d.PodResourcesSocket = filepath.Join(root, "pod-resources", filepath.Base(DefaultPodResourcesSocket))
	}
	return d
}

// kubeletPluginDir is the kubelet's device plugin directory.
const kubeletPluginDir = "/var/lib/kubelet/device-plugins"

// Node returns the node the DRA front publishes for: dra.nodeName, else
// $NODE_NAME (getenv), else an error that says how to set it.
func (d DRAConfig) Node(getenv func(string) string) (string, error) {
	if d.NodeName != "" {
		return d.NodeName, nil
	}
	if n := getenv(EnvNodeName); n != "" {
		return n, nil
	}
	return "", fmt.Errorf("dra.nodeName: the DRA front needs the node's name; set dra.nodeName, or $%s (in a pod, from the downward API's spec.nodeName)", EnvNodeName)
}

// UsesFront reports whether any resource of c is served by front.
func (c *PluginConfig) UsesFront(front string) bool {
	for i := range c.Plugins {
		if slices.Contains(c.Plugins[i].Fronts, front) {
			return true
		}
	}
	return false
}

// defaultFronts fills the fronts of every entry and the dra section.
func (c *PluginConfig) defaultFronts() {
	for i := range c.Plugins {
		if len(c.Plugins[i].Fronts) == 0 {
			c.Plugins[i].Fronts = []string{FrontDevicePlugin}
		}
	}
	d := &c.DRA
	if d.PluginsDir == "" {
		d.PluginsDir = DefaultDRAPluginsDir
	}
	if d.CDIDir == "" {
		d.CDIDir = DefaultCDIDir
	}
	if d.PodResourcesSocket == "" {
		d.PodResourcesSocket = DefaultPodResourcesSocket
	}
}

// validateFronts checks every entry's fronts and dra section, the names
// the DRA front would use, and the top-level dra section.
func (c *PluginConfig) validateFronts() field.ErrorList {
	var errs field.ErrorList
	shared := map[int]bool{} // entries with names set for several resources
	for i := range c.Plugins {
		spec := &c.Plugins[i]
		pp := field.NewPath("plugins").Index(i)
		fp := pp.Child("fronts")
		if len(spec.Fronts) == 0 {
			errs = append(errs, field.Required(fp, "name at least one of "+strings.Join(frontNames, ", ")+"; leave fronts out for [deviceplugin]"))
		}
		for j, f := range spec.Fronts {
			switch {
			case !slices.Contains(frontNames, f):
				errs = append(errs, field.NotSupported(fp.Index(j), f, frontNames))
			case slices.Index(spec.Fronts, f) != j:
				errs = append(errs, field.Duplicate(fp.Index(j), f))
			}
		}
		var names []string
		for _, rf := range spec.fronts() {
			names = append(names, rf.Resource)
		}
		dra := slices.Contains(spec.Fronts, FrontDRA)
		if spec.NVIDIA != nil && spec.NVIDIA.MIG != "" && !dra {
			errs = append(errs, field.Forbidden(pp.Child("nvidia", "mig"), "MIG partitions are served through DRA only (the device plugin API would count them as GPUs); add dra to fronts, or remove mig"))
		}
		if spec.NVIDIA != nil && len(spec.NVIDIA.Shared) > 0 && !dra {
			errs = append(errs, field.Forbidden(pp.Child("nvidia", "shared"), "shares of a GPU's memory are asked for through DRA; add dra to fronts, or remove shared (replicas alone time-slice GPUs through the device plugin API)"))
		}
		if spec.DRA == nil {
			continue
		}
		dp := pp.Child("dra")
		if !dra {
			errs = append(errs, field.Forbidden(dp, "applies only with the dra front; add dra to fronts, or remove dra"))
			continue
		}
		for _, f := range []struct{ name, value string }{{"driverName", spec.DRA.DriverName}, {"deviceClass", spec.DRA.DeviceClass}} {
			if f.value != "" && len(names) > 1 {
				shared[i] = true
				errs = append(errs, field.Forbidden(dp.Child(f.name), fmt.Sprintf("this entry serves %d resources (%s), which cannot share one %s; split them into one plugins entry each, or leave %s out for the defaults", len(names), strings.Join(names, ", "), f.name, f.name)))
			}
		}
	}

	// The names every resource with the dra front gets, defaults included.
	drivers := map[string]string{}
	classes := map[string]string{}
	for i := range c.Plugins {
		spec := &c.Plugins[i]
		pp := field.NewPath("plugins").Index(i)
		if !slices.Contains(spec.Fronts, FrontDRA) || shared[i] {
			continue
		}
		driverPath, classPath := pp.Child("dra", "driverName"), pp.Child("dra", "deviceClass")
		for _, rf := range spec.fronts() {
			set := spec.DRA != nil && spec.DRA.DriverName != ""
			if msgs := driverNameProblems(rf.DriverName); len(msgs) > 0 {
				if set {
					errs = append(errs, field.Invalid(driverPath, rf.DriverName, strings.Join(msgs, "; ")+"; "+nameExample))
				} else {
					errs = append(errs, field.Invalid(pp.Child("fronts"), FrontDRA, fmt.Sprintf("the default DRA driver name of %s, %q, %s; set dra.driverName (in an entry of its own)", rf.Resource, rf.DriverName, strings.Join(msgs, "; "))))
				}
			} else if other, dup := drivers[rf.DriverName]; dup {
				errs = append(errs, field.Duplicate(driverPath, fmt.Sprintf("%s: the driver of %s too; set dra.driverName on one of them", rf.DriverName, other)))
			} else {
				drivers[rf.DriverName] = rf.Resource
			}
			if spec.DRA != nil && spec.DRA.DeviceClass != "" {
				if msgs := content.IsDNS1123Subdomain(rf.DeviceClass); len(msgs) > 0 {
					errs = append(errs, field.Invalid(classPath, rf.DeviceClass, "must be a DeviceClass name: "+strings.Join(msgs, "; ")+"; "+nameExample))
					continue
				}
			}
			if other, dup := classes[rf.DeviceClass]; dup {
				errs = append(errs, field.Duplicate(classPath, fmt.Sprintf("%s: the DeviceClass of %s too; set dra.deviceClass on one of them", rf.DeviceClass, other)))
			} else {
				classes[rf.DeviceClass] = rf.Resource
			}
		}
	}

	dp := field.NewPath("dra")
	for _, d := range []struct{ name, value string }{{"pluginsDir", c.DRA.PluginsDir}, {"cdiDir", c.DRA.CDIDir}, {"podResourcesSocket", c.DRA.PodResourcesSocket}} {
		if !filepath.IsAbs(d.value) {
			errs = append(errs, field.Invalid(dp.Child(d.name), d.value, "must be an absolute path"))
		}
	}
	if c.DRA.NodeName != "" {
		if msgs := content.IsDNS1123Subdomain(c.DRA.NodeName); len(msgs) > 0 {
			errs = append(errs, field.Invalid(dp.Child("nodeName"), c.DRA.NodeName, "must be a node name: "+strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// driverNameProblems says why name is not a DRA driver name: a DNS
// subdomain of at most 63 characters.
func driverNameProblems(name string) []string {
	msgs := content.IsDNS1123Subdomain(name)
	if len(name) > maxDriverNameLength {
		msgs = append(msgs, fmt.Sprintf("must be no more than %d characters", maxDriverNameLength))
	}
	return msgs
}
