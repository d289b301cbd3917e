package draplugin

import (
	"log/slog"
	"regexp"
	"sort"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// Standard attribute names (k8s.io/dynamic-resource-allocation/deviceattribute).
const (
	AttrNUMANode = deviceattribute.StandardDeviceAttributeNUMANode
	AttrPCIBusID = deviceattribute.StandardDeviceAttributePCIBusID
	AttrPCIeRoot = deviceattribute.StandardDeviceAttributePCIeRoot
)

// maxAttrs is how many attributes and capacities one device may carry.
const maxAttrs = 32

// UnhealthyTaintKey returns the key of the NoSchedule taint an unhealthy
// device is published with.
func UnhealthyTaintKey(driver string) string { return driver + "/unhealthy" }

// naming maps device IDs to their published names and back, for one
// snapshot.
type naming struct {
	byName map[string]string // name -> ID
	byID   map[string]string // ID -> name
}

// nameDevices names every device; a name already taken by an earlier
// device (a hash collision) leaves the later device out, logged.
func nameDevices(devs []deviceplugin.Device, log *slog.Logger) naming {
	n := naming{byName: make(map[string]string, len(devs)), byID: make(map[string]string, len(devs))}
	for _, d := range devs {
		name := DeviceName(d.ID)
		if other, dup := n.byName[name]; dup {
			log.Error("Two device IDs have the same DRA device name; the second is not published", "name", name, "id", other, "leftOut", d.ID)
			continue
		}
		n.byName[name], n.byID[d.ID] = d.ID, name
	}
	return n
}

var bdf = regexp.MustCompile(`^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f]{1})$`)

var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,31}$`)

// PCIeRoot returns the PCIe root complex of a PCI device, "pci<domain>:<bus>",
// read by k8s.io/dynamic-resource-allocation/deviceattribute from the sysfs
// mounted at sysfsRoot.
func PCIeRoot(sysfsRoot, pciBusID string) (string, error) {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, deviceattribute.WithFSFromRoot(sysfsRoot))
	if err != nil {
		return "", err
	}
	return *attr.Value.StringValue, nil
}

// sliceDevices returns the ResourceSlice devices of a snapshot and the
// counter sets they consume: the inventory's DRA view (pkg/inventory),
// which leaves out what the device plugin front holds, by name.
func (d *Driver) sliceDevices() ([]resourcev1.Device, []resourcev1.CounterSet, bool) {
	view, sets, known := d.inv.DRAView()
	if !known {
		return nil, nil, false
	}
	if d.cfg.Retired {
		return nil, nil, true
	}
	all, _ := d.inv.Devices()
	names := nameDevices(all, d.log)
	describer, _ := d.inv.Plugin().(deviceplugin.Describer)
	out := make([]resourcev1.Device, 0, len(view))
	for _, dev := range view {
		name, ok := names.byID[dev.ID]
		if !ok {
			continue
		}
		out = append(out, d.sliceDevice(name, dev, describer))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	counterSets := make([]resourcev1.CounterSet, 0, len(sets))
	for _, set := range sets {
		cs := resourcev1.CounterSet{Name: CounterSetName(set.Name), Counters: make(map[string]resourcev1.Counter, len(set.Counters))}
		for c, v := range set.Counters {
			cs.Counters[c] = resourcev1.Counter{Value: quantity(v)}
		}
		counterSets = append(counterSets, cs)
	}
	return out, counterSets, true
}

// CounterSetName returns the published name of a plugin's counter set: a
// DNS label made from it as DeviceName makes one from a device ID.
func CounterSetName(set string) string { return DeviceName(set) }

// quantity writes an amount in binary units when it is a whole number of
// them (80Gi), and as a plain number otherwise (7).
func quantity(v int64) resource.Quantity {
	if v >= 1024 && v%1024 == 0 {
		return *resource.NewQuantity(v, resource.BinarySI)
	}
	return *resource.NewQuantity(v, resource.DecimalSI)
}

func str(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }

func (d *Driver) sliceDevice(name string, dev inventory.DRADevice, describer deviceplugin.Describer) resourcev1.Device {
	out := d.describedDevice(name, dev.Device, describer)
	if dev.Sharing == nil {
		return out
	}
	if dev.ChargesCounters {
		for _, use := range dev.Sharing.Consumes {
			cc := resourcev1.DeviceCounterConsumption{CounterSet: CounterSetName(use.Set), Counters: make(map[string]resourcev1.Counter, len(use.Counters))}
			for c, v := range use.Counters {
				cc.Counters[c] = resourcev1.Counter{Value: quantity(v)}
			}
			out.ConsumesCounters = append(out.ConsumesCounters, cc)
		}
	}
	if len(dev.Sharing.Shared) == 0 {
		return out
	}
	// A shared device: every holder takes a share of its capacities,
	// what is left of them after the device plugin front's holds.
	// Every capacity of a shared device is consumed by each share, the
	// whole value of one without a request policy: it carries only its
	// shared capacities.
	out.AllowMultipleAllocations = new(true)
	out.Capacity = map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{}
	for _, c := range sortedKeys(dev.Sharing.Shared) {
		sc := dev.Sharing.Shared[c]
		def := quantity(sc.Default)
		out.Capacity[resourcev1.QualifiedName(d.cfg.DriverName+"/"+c)] = resourcev1.DeviceCapacity{
			Value: quantity(dev.Capacity[c]),
			RequestPolicy: &resourcev1.CapacityRequestPolicy{
				Default:    &def,
				ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: new(quantity(sc.Min)), Step: new(quantity(max(sc.Step, 1)))},
			},
		}
	}
	return out
}

func (d *Driver) describedDevice(name string, dev deviceplugin.Device, describer deviceplugin.Describer) resourcev1.Device {
	drv := d.cfg.DriverName
	log := d.log.With("device", dev.ID)
	out := resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}}
	if len(dev.ID) <= resourcev1.DeviceAttributeMaxValueLength {
		out.Attributes[resourcev1.QualifiedName(drv+"/id")] = str(dev.ID)
	} else {
		log.Warn("Device ID longer than an attribute value may be; published without its id attribute", "max", resourcev1.DeviceAttributeMaxValueLength)
	}
	if len(dev.NUMANodes) == 1 {
		n := dev.NUMANodes[0]
		out.Attributes[AttrNUMANode] = resourcev1.DeviceAttribute{IntValue: &n}
	}
	if !dev.Healthy {
		out.Taints = []resourcev1.DeviceTaint{{Key: UnhealthyTaintKey(drv), Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	}
	if describer == nil {
		return out
	}
	info, ok := describer.Describe(dev.ID)
	if !ok {
		return out
	}
	if info.PCIBusID != "" {
		if !bdf.MatchString(info.PCIBusID) {
			log.Warn("PCI bus ID not in domain:bus:device.function form; not published", "pciBusId", info.PCIBusID)
		} else {
			out.Attributes[AttrPCIBusID] = str(info.PCIBusID)
			if root, err := PCIeRoot(d.cfg.SysfsRoot, info.PCIBusID); err != nil {
				log.Debug("No PCIe root for the device", "err", err)
			} else {
				out.Attributes[AttrPCIeRoot] = str(root)
			}
		}
	}
	for _, k := range sortedKeys(info.Attributes) {
		a := info.Attributes[k]
		if !cIdentifier.MatchString(k) {
			log.Warn("Attribute name is not a C identifier of at most 32 characters; not published", "attribute", k)
			continue
		}
		if len(out.Attributes) >= maxAttrs {
			log.Warn("More than 32 attributes; the rest are not published", "attribute", k)
			break
		}
		v := resourcev1.DeviceAttribute{IntValue: a.Int, BoolValue: a.Bool, StringValue: a.String, VersionValue: a.Version}
		out.Attributes[resourcev1.QualifiedName(drv+"/"+k)] = v
	}
	for _, k := range sortedKeys(info.Capacity) {
		q, err := resource.ParseQuantity(info.Capacity[k])
		if err != nil || !cIdentifier.MatchString(k) {
			log.Warn("Capacity is not a C identifier with a quantity; not published", "capacity", k, "value", info.Capacity[k])
			continue
		}
		if len(out.Attributes)+len(out.Capacity) >= maxAttrs {
			log.Warn("More than 32 attributes and capacities; the rest are not published", "capacity", k)
			break
		}
		if out.Capacity == nil {
			out.Capacity = map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{}
		}
		out.Capacity[resourcev1.QualifiedName(drv+"/"+k)] = resourcev1.DeviceCapacity{Value: q}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
