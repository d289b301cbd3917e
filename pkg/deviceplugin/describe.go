package deviceplugin

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
