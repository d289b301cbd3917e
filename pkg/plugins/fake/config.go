package fake

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// EnvDevices is the environment variable the fake plugin sets, by default,
// to the comma-separated IDs a container got.
const EnvDevices = "DPKIT_FAKE_DEVICES"

// Preferred allocation policies.
const (
	PreferNone       = "none"        // GetPreferredAllocation is not offered
	PreferNUMAPacked = "numa-packed" // as few NUMA nodes as possible (deviceplugin.PackNUMA)
	PreferFirst      = "first"       // the lowest IDs, in natural order
)

// Config is the fake plugin's section of the plugin config file.
type Config struct {
	// Resources are the fake resources to serve.
	Resources []ResourceConfig `json:"resources"`
}

// ResourceConfig describes one fake resource.
type ResourceConfig struct {
	// Name is the extended resource name, e.g. example.com/foo.
	Name string `json:"name"`
	// Count is the number of devices. Default 8.
	Count int `json:"count,omitempty"`
	// IDPattern names devices; "{index}" is replaced with 0..Count-1.
	// Default "dev-{index}".
	IDPattern string `json:"idPattern,omitempty"`
	// NUMANodes spreads the devices over this many NUMA nodes in equal
	// contiguous blocks (devices 0..3 on node 0, 4..7 on node 1 for 8
	// devices over 2 nodes). 0 reports no topology.
	NUMANodes int `json:"numaNodes,omitempty"`
	// Unhealthy lists devices that start unhealthy.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// HealthChanges change devices' health at times after start.
	HealthChanges []HealthChange `json:"healthChanges,omitempty"`
	// PreferredAllocation is none (default), numa-packed or first.
	PreferredAllocation string `json:"preferredAllocation,omitempty"`
	// PreStartRequired asks the kubelet to call PreStartContainer.
	PreStartRequired bool `json:"preStartRequired,omitempty"`
	// Allocate is what Allocate returns.
	Allocate AllocateConfig `json:"allocate,omitempty"`
	// Attributes describe every device of the resource to fronts that
	// publish attributes (the DRA front): name -> a string, a whole number
	// or true/false, e.g. {model: fake-a100, generation: 3, ecc: true}.
	// Every device also gets the attribute index, its number 0..Count-1.
	// Names are C identifiers of at most 32 characters.
	Attributes map[string]AttributeValue `json:"attributes,omitempty"`
	// Capacity gives every device quantities, e.g. {memory: 80Gi}. Names
	// follow the rule of Attributes.
	Capacity map[string]string `json:"capacity,omitempty"`
	// Partitions cut every device into parts, as MIG or compute
	// partitions do: each profile adds devices that take part of the
	// device's capacity (its counters). The whole device takes all of it,
	// so it is never given while a partition is, nor a partition while
	// it is. See docs/sharing.md.
	Partitions []PartitionConfig `json:"partitions,omitempty"`
	// Shared lets many holders share every device at once, each taking
	// part of the capacities named here (capacity -> how a share asks).
	Shared map[string]plugins.SharePolicy `json:"shared,omitempty"`
	// Replicas, with shared, offers each device to the device plugin
	// front as this many replicas <device>::<n>, each a fixed share of
	// it (every shared capacity divided by replicas); the device itself
	// is then offered through DRA only. Replicas and DRA shares of a
	// device never add up to more than it has.
	Replicas int `json:"replicas,omitempty"`
}

// PartitionConfig is one partition profile of a fake device, e.g.
// {profile: 1g-10gb, count: 7, consumes: {memory: 10Gi, slices: 1}}.
type PartitionConfig struct {
	// Profile names the partition, a DNS label: partition devices are
	// <device>-<profile>-<n>, and carry the attribute profile.
	Profile string `json:"profile"`
	// Count is how many partitions of this profile each device offers:
	// the most that fit the device at once.
	Count int `json:"count"`
	// Consumes is what one partition takes of the device's capacities
	// (whole-number quantities, each a capacity of the resource).
	Consumes map[string]string `json:"consumes"`
}

// AttributeValue is one fake device attribute: a string, a whole number
// or a boolean, typed as YAML writes it ("3" is a string, 3 a number).
type AttributeValue struct {
	deviceplugin.Attribute
}

// UnmarshalJSON accepts a JSON string, integer or boolean.
func (v *AttributeValue) UnmarshalJSON(b []byte) error {
	var x any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&x); err != nil {
		return err
	}
	switch x := x.(type) {
	case string:
		v.Attribute = deviceplugin.StringAttr(x)
	case bool:
		v.Attribute = deviceplugin.BoolAttr(x)
	case json.Number:
		n, err := strconv.ParseInt(x.String(), 10, 64)
		if err != nil {
			return fmt.Errorf("must be a string, a whole number or true/false, not %s", x)
		}
		v.Attribute = deviceplugin.IntAttr(n)
	default:
		return fmt.Errorf("must be a string, a whole number or true/false, not %s", bytes.TrimSpace(b))
	}
	return nil
}

// MarshalJSON writes the value as its JSON string, number or boolean.
func (v AttributeValue) MarshalJSON() ([]byte, error) {
	switch {
	case v.String != nil:
		return json.Marshal(*v.String)
	case v.Int != nil:
		return json.Marshal(*v.Int)
	case v.Bool != nil:
		return json.Marshal(*v.Bool)
	case v.Version != nil:
		return json.Marshal(*v.Version)
	}
	return []byte("null"), nil
}

// IndexAttribute is the attribute every fake device gets: its number,
// 0..Count-1.
const IndexAttribute = "index"

// maxAttributes is how many attributes and capacities the DRA API allows
// one device.
const maxAttributes = 32

var attributeNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,31}$`)

// HealthChange sets a device's health at a time after the plugin starts,
// e.g. {device: dev-3, after: 5s, health: Unhealthy}.
type HealthChange struct {
	Device string           `json:"device"`
	After  plugins.Duration `json:"after"`
	Health string           `json:"health"`
}

// AllocateConfig is what the fake plugin answers to Allocate. In every
// string, "{ids}" is replaced with the comma-separated allocated IDs. In
// Devices and CDIDevices, an entry containing "{id}" is repeated for each
// allocated device with "{id}" replaced by its ID and "{index}" by its
// index.
type AllocateConfig struct {
	// Envs are added to the container's environment. DPKIT_FAKE_DEVICES
	// is always set unless Envs sets it itself.
	Envs map[string]string `json:"envs,omitempty"`
	// Mounts are bind mounts into the container.
	Mounts []Mount `json:"mounts,omitempty"`
	// Devices are device nodes for the container.
	Devices []DeviceNode `json:"devices,omitempty"`
	// CDIDevices are fully qualified CDI device names.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// Annotations are added to the container.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Error, when set, makes every Allocate fail with this message.
	Error string `json:"error,omitempty"`
	// Failures make Allocate fail at times after the plugin starts, e.g.
	// [{after: 30s, count: 2, message: "GPU fell off the bus"}]. A call
	// fails with the first failure, in list order, whose time has come and
	// that has calls left.
	Failures []AllocateFailure `json:"failures,omitempty"`
}

// AllocateFailure makes Allocate fail: Count calls (every call when
// unset) from After on fail with Message. Every front that allocates
// through the plugin's Allocate sees it: the kubelet's Allocate, and
// the DRA front's preparation of a claim.
type AllocateFailure struct {
	// Message is the error Allocate returns.
	Message string `json:"message"`
	// After is when the failure starts, from the plugin's start (the same
	// clock as healthChanges). Default 0: at once.
	After plugins.Duration `json:"after,omitempty"`
	// Count is how many calls fail; unset means every call from After on.
	Count *int `json:"count,omitempty"`
}

// Mount is a bind mount.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// DeviceNode is a device node to create in the container.
type DeviceNode struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	// Permissions are cgroup permissions: any of r, w and m. Default rw.
	Permissions string `json:"permissions,omitempty"`
}

// Default fills unset fields.
func (c *Config) Default() {
	for i := range c.Resources {
		r := &c.Resources[i]
		if r.Count == 0 {
			r.Count = 8
		}
		if r.IDPattern == "" {
			r.IDPattern = "dev-{index}"
		}
		if r.PreferredAllocation == "" {
			r.PreferredAllocation = PreferNone
		}
		for j := range r.Allocate.Devices {
			if r.Allocate.Devices[j].Permissions == "" {
				r.Allocate.Devices[j].Permissions = "rw"
			}
		}
	}
}

var permissionsRE = regexp.MustCompile(`^[rwm]{1,3}$`)

// Validate reports every problem in c with its field path.
func (c *Config) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(c.Resources) == 0 {
		errs = append(errs, field.Required(p.Child("resources"), "list at least one resource, e.g. {name: example.com/foo, count: 8}"))
	}
	for i, r := range c.Resources {
		rp := p.Child("resources").Index(i)
		if err := deviceplugin.ValidateResourceName(r.Name); err != nil {
			errs = append(errs, field.Invalid(rp.Child("name"), r.Name, err.Error()))
		}
		if r.Count < 1 || r.Count > 1_000_000 {
			errs = append(errs, field.Invalid(rp.Child("count"), r.Count, "must be between 1 and 1000000"))
		}
		if !strings.Contains(r.IDPattern, "{index}") {
			errs = append(errs, field.Invalid(rp.Child("idPattern"), r.IDPattern, `must contain "{index}", e.g. "dev-{index}"`))
		}
		if r.NUMANodes < 0 || r.NUMANodes > r.Count && r.Count > 0 {
			errs = append(errs, field.Invalid(rp.Child("numaNodes"), r.NUMANodes, "must be between 0 and count"))
		}
		ids := make(map[string]bool, r.Count)
		for j := range max(r.Count, 0) {
			if j > 1_000_000 {
				break
			}
			ids[deviceID(r.IDPattern, j)] = true
		}
		for j, id := range r.Unhealthy {
			if !ids[id] {
				errs = append(errs, field.NotFound(rp.Child("unhealthy").Index(j), id))
			}
		}
		for j, hc := range r.HealthChanges {
			hp := rp.Child("healthChanges").Index(j)
			if !ids[hc.Device] {
				errs = append(errs, field.NotFound(hp.Child("device"), hc.Device))
			}
			if hc.After.Duration < 0 {
				errs = append(errs, field.Invalid(hp.Child("after"), hc.After.String(), "must not be negative"))
			}
			if hc.Health != pluginapi.Healthy && hc.Health != pluginapi.Unhealthy {
				errs = append(errs, field.NotSupported(hp.Child("health"), hc.Health, []string{pluginapi.Healthy, pluginapi.Unhealthy}))
			}
		}
		switch r.PreferredAllocation {
		case PreferNone, PreferNUMAPacked, PreferFirst:
		default:
			errs = append(errs, field.NotSupported(rp.Child("preferredAllocation"), r.PreferredAllocation, []string{PreferNone, PreferNUMAPacked, PreferFirst}))
		}
		errs = append(errs, r.validateDescription(rp)...)
		errs = append(errs, r.validateSharing(rp)...)
		errs = append(errs, r.Allocate.validate(rp.Child("allocate"))...)
	}
	return errs
}

// validate checks the Allocate answer at ap.
func (a AllocateConfig) validate(ap *field.Path) field.ErrorList {
	var errs field.ErrorList
	for j, f := range a.Failures {
		fp := ap.Child("failures").Index(j)
		if f.Message == "" {
			errs = append(errs, field.Required(fp.Child("message"), `the error Allocate returns, e.g. "injected failure"`))
		}
		if f.After.Duration < 0 {
			errs = append(errs, field.Invalid(fp.Child("after"), f.After.String(), "must not be negative"))
		}
		if f.Count != nil && *f.Count < 1 {
			errs = append(errs, field.Invalid(fp.Child("count"), *f.Count, "must be at least 1; leave it out to fail every call from after on"))
		}
	}
	if a.Error != "" && len(a.Failures) > 0 {
		errs = append(errs, field.Forbidden(ap.Child("failures"), "error already fails every call; remove error, or failures"))
	}
	for j, m := range a.Mounts {
		if m.ContainerPath == "" {
			errs = append(errs, field.Required(ap.Child("mounts").Index(j).Child("containerPath"), "the path inside the container"))
		}
		if m.HostPath == "" {
			errs = append(errs, field.Required(ap.Child("mounts").Index(j).Child("hostPath"), "the path on the host"))
		}
	}
	for j, d := range a.Devices {
		dp := ap.Child("devices").Index(j)
		if d.ContainerPath == "" {
			errs = append(errs, field.Required(dp.Child("containerPath"), "the device path inside the container"))
		}
		if d.HostPath == "" {
			errs = append(errs, field.Required(dp.Child("hostPath"), "the device path on the host"))
		}
		if !permissionsRE.MatchString(d.Permissions) {
			errs = append(errs, field.Invalid(dp.Child("permissions"), d.Permissions, `use any of "r", "w" and "m", e.g. "rw"`))
		}
	}
	for j, name := range a.CDIDevices {
		if !strings.Contains(name, "=") || !strings.Contains(name, "/") {
			errs = append(errs, field.Invalid(ap.Child("cdiDevices").Index(j), name, `must be a fully qualified CDI name "vendor.com/class=device", e.g. "example.com/foo={id}"`))
		}
	}
	return errs
}

// validateDescription checks the attributes and capacity of r.
func (r ResourceConfig) validateDescription(rp *field.Path) field.ErrorList {
	var errs field.ErrorList
	name := func(p *field.Path, n string) {
		if !attributeNameRE.MatchString(n) {
			errs = append(errs, field.Invalid(p, n, "must be a C identifier of at most 32 characters (letters, digits and _, not starting with a digit), e.g. model or memory_gb"))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(r.Attributes)) {
		p := rp.Child("attributes").Key(n)
		name(p, n)
		if n == IndexAttribute {
			errs = append(errs, field.Forbidden(p, "every device gets index, its number, from the plugin; use another name"))
		}
		if v := r.Attributes[n]; v.String == nil && v.Int == nil && v.Bool == nil && v.Version == nil {
			errs = append(errs, field.Required(p, "give a string, a whole number or true/false"))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(r.Capacity)) {
		p := rp.Child("capacity").Key(n)
		name(p, n)
		if _, ok := r.Attributes[n]; ok {
			errs = append(errs, field.Duplicate(p, n+" is also an attribute; rename one of the two"))
		}
		if !plugins.ValidQuantity(r.Capacity[n]) {
			errs = append(errs, field.Invalid(p, r.Capacity[n], `must be a quantity, e.g. "80Gi" or "4"`))
		}
	}
	if n := len(r.Attributes) + len(r.Capacity) + 1; n > maxAttributes {
		errs = append(errs, field.Invalid(rp.Child("attributes"), len(r.Attributes), fmt.Sprintf("a device may have at most %d attributes and capacities, index included; this resource gives %d: remove some", maxAttributes, n)))
	}
	return errs
}

func deviceID(pattern string, i int) string {
	return strings.ReplaceAll(pattern, "{index}", fmt.Sprint(i))
}

// numaNode returns the NUMA node of device i of count over nodes nodes.
func numaNode(i, count, nodes int) int64 {
	return int64(i * nodes / count)
}

// schedule returns the health changes sorted by time.
func (r ResourceConfig) schedule() []HealthChange {
	out := slices.Clone(r.HealthChanges)
	slices.SortStableFunc(out, func(a, b HealthChange) int { return cmp.Compare(a.After.Duration, b.After.Duration) })
	return out
}
