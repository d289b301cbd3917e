package deviceplugin

import "strconv"

// DeviceInfo describes a device beyond what the kubelet's device plugin
// API carries (ID, health, NUMA nodes), for fronts that publish devices
// with attributes: the DRA front (pkg/draplugin) turns it into a ResourceSlice
// device's attributes and capacity. It holds no Kubernetes API types, so
// a plugin describes its devices without importing them.
type DeviceInfo struct {
	// PCIBusID is the device's PCI address (0000:3b:00.0) when it has
	// one. The DRA front publishes it as resource.kubernetes.io/pciBusID
	// and derives resource.kubernetes.io/pcieRoot from it.
	PCIBusID string
	// Attributes are published under the driver's domain: "model"
	// becomes <driver>/model. Names are C identifiers of at most 32
	// characters.
	Attributes map[string]Attribute
	// Capacity holds quantities such as "memory": "80Gi", published under
	// the driver's domain.
	Capacity map[string]string
	// Sharing, when set, says how the device shares a physical device
	// with others or is shared; nil is a device one holder holds whole.
	Sharing *Sharing
}

// Attribute is one typed attribute value; exactly one field is set. Use
// StringAttr, IntAttr, BoolAttr and VersionAttr to build one.
type Attribute struct {
	String  *string
	Int     *int64
	Bool    *bool
	Version *string // a semantic version, such as "580.65.6"
}

// StringAttr returns a string attribute.
func StringAttr(s string) Attribute { return Attribute{String: &s} }

// IntAttr returns an integer attribute.
func IntAttr(n int64) Attribute { return Attribute{Int: &n} }

// BoolAttr returns a boolean attribute.
func BoolAttr(b bool) Attribute { return Attribute{Bool: &b} }

// VersionAttr returns a semantic-version attribute.
func VersionAttr(v string) Attribute { return Attribute{Version: &v} }

// Describer is implemented by plugins that know more about their devices
// than IDs: Describe returns what it knows about the device with the given
// ID, and false for an ID it does not know. It is optional and found by
// type assertion on the Plugin; only fronts that publish attributes call
// it.
type Describer interface {
	Describe(id string) (DeviceInfo, bool)
}

// Sharing says how a device shares a physical device with other devices,
// or is shared itself. The inventory's arbiter (pkg/inventory) admits a
// grant only while what it takes still fits, whichever front asks; the DRA
// front publishes the same rules to the scheduler (shared counters,
// consumable capacity). Amounts are whole numbers of the base unit: bytes
// for memory, a count for slices or compute units.
type Sharing struct {
	// Consumes is what holding the device takes from the plugin's counter
	// sets (CounterSetter): a partition takes its slices and memory from
	// its GPU's set, the whole GPU takes all of it. A shared device takes
	// it once, however many hold shares of it.
	Consumes []CounterUse
	// Shared, when not empty, lets many holders hold the device at once:
	// each share takes an amount of every capacity named here, and the
	// shares never add up to more than its total.
	Shared map[string]SharedCapacity
	// ShareOf makes the device a fixed share of another device of the same
	// plugin, which must be Shared: a device plugin replica of a GPU.
	// Holding it takes ShareAmounts of that device's capacities. The DRA
	// front publishes the shared device, not its replicas.
	ShareOf string
	// ShareAmounts is what a ShareOf device takes: capacity -> amount.
	// A capacity left out takes its default.
	ShareAmounts map[string]int64
	// DRAOnly keeps the device from the device plugin front: a partition
	// the kubelet's device plugin API could not tell from a whole device
	// under the same resource name.
	DRAOnly bool
}

// CounterUse is what a device takes from one counter set.
type CounterUse struct {
	// Set names the counter set (CounterSetter).
	Set string
	// Counters maps counter names to the amounts taken.
	Counters map[string]int64
}

// SharedCapacity is one capacity of a shared device, and how a share asks
// for part of it: a share takes Default when it asks nothing, and an
// amount asked is rounded up to Min + n*Step.
type SharedCapacity struct {
	// Total is the device's whole capacity.
	Total int64
	// Default is what a share that asks nothing takes; Total makes such
	// a share the whole device.
	Default int64
	// Min is the least a share takes; Step the granule above it (1 when
	// zero).
	Min, Step int64
}

// CounterSet is a named set of counters that devices consume: one per
// physical device that can be partitioned.
type CounterSet struct {
	// Name is a DNS label, unique among the plugin's sets.
	Name string
	// Counters maps counter names (DNS labels) to the physical device's
	// totals, such as {memory: 85899345920, slices: 7}.
	Counters map[string]int64
}

// CounterSetter is implemented by plugins whose devices consume counters
// (Sharing.Consumes): it returns the counter sets of the devices the
// latest Scan reported. It is optional and found by type assertion on the
// Plugin.
type CounterSetter interface {
	CounterSets() []CounterSet
}

// FormatAmount writes an amount (Sharing) as a quantity: 21474836480 is "20Gi",
// 7 is "7".
func FormatAmount(v int64) string {
	if v == 0 {
		return "0"
	}
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ei", 60}, {"Pi", 50}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if v%(1<<u.shift) == 0 {
			return strconv.FormatInt(v>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}
