package generic

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// Defaults.
const (
	DefaultDomain         = "dpkit.io"
	DefaultRescanInterval = 10 * time.Second
	DefaultPermissions    = "rw"
	DefaultCDISpecDir     = "/var/run/cdi"
	// MaxCount bounds how many containers may share one device.
	MaxCount = 10000
)

// Config is the generic plugin's section of the plugin config file:
//
//	generic:
//	  groups:
//	  - name: serial                 # resource dpkit.io/serial
//	    paths: [{path: /dev/ttyUSB*}]
//	  - name: example.com/fuse
//	    paths: [{path: /dev/fuse}]
//	    count: 10
type Config struct {
	// Groups are the device groups; each is served as one resource.
	Groups []Group `json:"groups"`
	// Domain prefixes group names that have no domain. Default dpkit.io.
	Domain string `json:"domain,omitempty"`
	// RescanInterval is how often sysfs and the dev root are scanned in
	// addition to the change notifications on the dev root. Default 10s.
	RescanInterval plugins.Duration `json:"rescanInterval,omitempty"`
	// CDI, when enabled, writes a CDI spec for every group and answers
	// Allocate with CDI device names instead of device nodes and mounts.
	CDI CDIConfig `json:"cdi,omitempty"`
}

// CDIConfig configures CDI spec generation.
type CDIConfig struct {
	Enabled bool `json:"enabled,omitempty"`
	// SpecDir is where spec files are written (the container runtime's
	// CDI spec directory). Default /var/run/cdi.
	SpecDir string `json:"specDir,omitempty"`
}

// Group is a set of devices served as one resource.
type Group struct {
	// Name is the resource name: "serial" (the domain is added) or a full
	// name such as "example.com/serial".
	Name string `json:"name"`
	// Paths are device nodes by host path or glob (/dev/ttyUSB*). Every
	// match is one device.
	Paths []PathSpec `json:"paths,omitempty"`
	// USB selects USB devices; every match is one device with its
	// /dev/bus/usb node and serial ports.
	USB []USBSpec `json:"usb,omitempty"`
	// PCI selects PCI functions; every match is one device with its VFIO
	// group node (when bound to vfio-pci) or its DRM nodes.
	PCI []PCISpec `json:"pci,omitempty"`
	// Count is how many containers may share one device: the plugin
	// advertises Count IDs per device (fuse-0 ... fuse-9). Default 1.
	Count int `json:"count,omitempty"`
	// Permissions are the cgroup permissions of the device nodes: any of
	// r, w and m. Default rw.
	Permissions string `json:"permissions,omitempty"`
	// Mounts are bind mounts every container of the group gets.
	Mounts []Mount `json:"mounts,omitempty"`
	// Env is set in every container of the group.
	Env map[string]string `json:"env,omitempty"`
}

// PathSpec selects device nodes by path.
type PathSpec struct {
	// Path is a host path below /dev, with optional wildcards.
	Path string `json:"path"`
	// ContainerPath is where the node appears in the container; only for
	// paths without wildcards. Default: the host path.
	ContainerPath string `json:"containerPath,omitempty"`
}

// USBSpec selects USB devices by IDs (hex, as lsusb shows them).
type USBSpec struct {
	Vendor  string `json:"vendor"`
	Product string `json:"product,omitempty"`
	// Serial, when set, selects one device by its serial number.
	Serial string `json:"serial,omitempty"`
}

// PCISpec selects PCI functions. Empty fields match anything; Class
// matches as a prefix ("0302" matches 030200).
type PCISpec struct {
	Vendor string `json:"vendor,omitempty"`
	Device string `json:"device,omitempty"`
	Class  string `json:"class,omitempty"`
}

// Mount is a bind mount from the host.
type Mount struct {
	HostPath string `json:"hostPath"`
	// ContainerPath defaults to HostPath.
	ContainerPath string `json:"containerPath,omitempty"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// Default fills unset fields.
func (c *Config) Default() {
	if c.Domain == "" {
		c.Domain = DefaultDomain
	}
	if c.RescanInterval.Duration == 0 {
		c.RescanInterval.Duration = DefaultRescanInterval
	}
	if c.CDI.SpecDir == "" {
		c.CDI.SpecDir = DefaultCDISpecDir
	}
	for i := range c.Groups {
		g := &c.Groups[i]
		if g.Count == 0 {
			g.Count = 1
		}
		if g.Permissions == "" {
			g.Permissions = DefaultPermissions
		}
		for j := range g.Mounts {
			if g.Mounts[j].ContainerPath == "" {
				g.Mounts[j].ContainerPath = g.Mounts[j].HostPath
			}
		}
		for j := range g.USB {
			g.USB[j].Vendor = strings.ToLower(strings.TrimPrefix(g.USB[j].Vendor, "0x"))
			g.USB[j].Product = strings.ToLower(strings.TrimPrefix(g.USB[j].Product, "0x"))
		}
		for j := range g.PCI {
			s := &g.PCI[j]
			s.Vendor = strings.ToLower(strings.TrimPrefix(s.Vendor, "0x"))
			s.Device = strings.ToLower(strings.TrimPrefix(s.Device, "0x"))
			s.Class = strings.ToLower(strings.TrimPrefix(s.Class, "0x"))
		}
	}
}

// ResourceName returns the full resource name of group g.
func (c *Config) ResourceName(g Group) string {
	if strings.Contains(g.Name, "/") {
		return g.Name
	}
	domain := c.Domain
	if domain == "" {
		domain = DefaultDomain
	}
	return domain + "/" + g.Name
}

var (
	permissionsRE = regexp.MustCompile(`^[rwm]{1,3}$`)
	hex4RE        = regexp.MustCompile(`^[0-9a-f]{4}$`)
	classRE       = regexp.MustCompile(`^[0-9a-f]{2,6}$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate reports every problem in c with its field path. Call Default
// first.
func (c *Config) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	gp := p.Child("groups")
	if len(c.Groups) == 0 {
		errs = append(errs, field.Required(gp, "list at least one group, e.g. {name: serial, paths: [{path: /dev/ttyUSB*}]}"))
	}
	if c.RescanInterval.Duration < 100*time.Millisecond {
		errs = append(errs, field.Invalid(p.Child("rescanInterval"), c.RescanInterval.String(), "must be at least 100ms, e.g. 10s"))
	}
	if c.CDI.Enabled && !path.IsAbs(c.CDI.SpecDir) {
		errs = append(errs, field.Invalid(p.Child("cdi", "specDir"), c.CDI.SpecDir, "must be an absolute path, e.g. /var/run/cdi"))
	}
	seen := make(map[string]int)
	for i, g := range c.Groups {
		ip := gp.Index(i)
		name := c.ResourceName(g)
		if g.Name == "" {
			errs = append(errs, field.Required(ip.Child("name"), `name the resource, e.g. "serial" or "example.com/serial"`))
		} else if err := deviceplugin.ValidateResourceName(name); err != nil {
			errs = append(errs, field.Invalid(ip.Child("name"), g.Name, err.Error()))
		} else if c.CDI.Enabled {
			vendor, class := parser.ParseQualifier(name)
			if err := parser.ValidateVendorName(vendor); err != nil {
				errs = append(errs, field.Invalid(ip.Child("name"), g.Name, "not usable as a CDI kind: "+err.Error()))
			} else if err := parser.ValidateClassName(class); err != nil {
				errs = append(errs, field.Invalid(ip.Child("name"), g.Name, "not usable as a CDI kind: "+err.Error()))
			}
		}
		if j, dup := seen[name]; dup {
			errs = append(errs, field.Duplicate(ip.Child("name"), fmt.Sprintf("%s (also groups[%d]); merge the two groups", name, j)))
		}
		seen[name] = i
		if len(g.Paths)+len(g.USB)+len(g.PCI) == 0 {
			errs = append(errs, field.Required(ip, "select devices with paths, usb or pci"))
		}
		if g.Count < 1 || g.Count > MaxCount {
			errs = append(errs, field.Invalid(ip.Child("count"), g.Count, fmt.Sprintf("must be between 1 and %d", MaxCount)))
		}
		if !permissionsRE.MatchString(g.Permissions) || hasRepeat(g.Permissions) {
			errs = append(errs, field.Invalid(ip.Child("permissions"), g.Permissions, `use each of "r", "w" and "m" at most once, e.g. "rw" or "rwm"`))
		}
		errs = append(errs, validatePaths(ip.Child("paths"), g.Paths)...)
		errs = append(errs, validateUSB(ip.Child("usb"), g.USB)...)
		errs = append(errs, validatePCI(ip.Child("pci"), g.PCI)...)
		errs = append(errs, validateMounts(ip.Child("mounts"), g.Mounts)...)
		for k := range g.Env {
			if !envNameRE.MatchString(k) {
				errs = append(errs, field.Invalid(ip.Child("env").Key(k), k, "must be an environment variable name: letters, digits and _, not starting with a digit"))
			}
		}
	}
	return errs
}

// validatePaths checks the device node paths of a group.
func validatePaths(p *field.Path, items []PathSpec) field.ErrorList {
	var errs field.ErrorList
	for j, ps := range items {
		pp := p.Index(j)
		if _, err := devfs.Rel(ps.Path); err != nil {
			errs = append(errs, field.Invalid(pp.Child("path"), ps.Path, "must be a host path below /dev, e.g. /dev/ttyUSB*"))
		} else if _, err := path.Match(ps.Path, ""); err != nil {
			errs = append(errs, field.Invalid(pp.Child("path"), ps.Path, "bad pattern: "+err.Error()))
		}
		if ps.ContainerPath != "" {
			if devfs.HasMeta(ps.Path) {
				errs = append(errs, field.Forbidden(pp.Child("containerPath"), "only for paths without wildcards; remove it or name one device"))
			} else if !path.IsAbs(ps.ContainerPath) {
				errs = append(errs, field.Invalid(pp.Child("containerPath"), ps.ContainerPath, "must be an absolute path"))
			}
		}
	}
	return errs
}

// validateUSB checks the USB selectors of a group.
func validateUSB(p *field.Path, items []USBSpec) field.ErrorList {
	var errs field.ErrorList
	for j, u := range items {
		up := p.Index(j)
		if !hex4RE.MatchString(u.Vendor) {
			errs = append(errs, field.Invalid(up.Child("vendor"), u.Vendor, `must be 4 hex digits, e.g. "0403"`))
		}
		if u.Product != "" && !hex4RE.MatchString(u.Product) {
			errs = append(errs, field.Invalid(up.Child("product"), u.Product, `must be 4 hex digits, e.g. "6001"`))
		}
	}
	return errs
}

// validatePCI checks the PCI selectors of a group.
func validatePCI(p *field.Path, items []PCISpec) field.ErrorList {
	var errs field.ErrorList
	for j, s := range items {
		sp := p.Index(j)
		if s.Vendor == "" && s.Device == "" && s.Class == "" {
			errs = append(errs, field.Required(sp, "set vendor, device or class; an empty selector matches every PCI function"))
		}
		if s.Vendor != "" && !hex4RE.MatchString(s.Vendor) {
			errs = append(errs, field.Invalid(sp.Child("vendor"), s.Vendor, `must be 4 hex digits, e.g. "10de"`))
		}
		if s.Device != "" && !hex4RE.MatchString(s.Device) {
			errs = append(errs, field.Invalid(sp.Child("device"), s.Device, `must be 4 hex digits, e.g. "1021"`))
		}
		if s.Class != "" && !classRE.MatchString(s.Class) {
			errs = append(errs, field.Invalid(sp.Child("class"), s.Class, `must be 2 to 6 hex digits, e.g. "0207" or "030200"`))
		}
	}
	return errs
}

// validateMounts checks the extra mounts of a group.
func validateMounts(p *field.Path, items []Mount) field.ErrorList {
	var errs field.ErrorList
	for j, m := range items {
		mp := p.Index(j)
		if !path.IsAbs(m.HostPath) {
			errs = append(errs, field.Invalid(mp.Child("hostPath"), m.HostPath, "must be an absolute path on the host"))
		}
		if !path.IsAbs(m.ContainerPath) {
			errs = append(errs, field.Invalid(mp.Child("containerPath"), m.ContainerPath, "must be an absolute path in the container"))
		}
	}
	return errs
}

func hasRepeat(s string) bool {
	for i := range s {
		if strings.IndexByte(s[i+1:], s[i]) >= 0 {
			return true
		}
	}
	return false
}
