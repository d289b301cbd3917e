// Package draplugin serves an inventory's devices (pkg/inventory) as a DRA
// driver, on the ecosystem's own helper
// (k8s.io/dynamic-resource-allocation/kubeletplugin): it registers with the
// kubelet, serves DRAPlugin v1 and v1beta1 and DRAResourceHealth v1 and
// v1alpha1 (so kubelets v1.34 to v1.37 all see health), serializes
// Prepare and Unprepare, supports rolling updates (Config.PodUID) and
// publishes ResourceSlices through the helper's ResourceSlice controller.
// What is dpkit's own is the rest: the devices' names and attributes,
// preparing a claim by calling the plugin's Allocate and turning the
// answer into a CDI spec, the checkpoint of what was prepared, and the
// arbiter shared with the device plugin front.
//
// A device is never given out through DRA and the device plugin front at
// once: both acquire it in the inventory's arbiter first.
package draplugin

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Defaults of Config.
const (
	DefaultPluginsDir    = "/var/lib/kubelet/plugins"
	DefaultRegistryDir   = "/var/lib/kubelet/plugins_registry"
	DefaultCDIDir        = "/var/run/cdi"
	DefaultSysfsRoot     = "/sys"
	DefaultHealthTimeout = 30 * time.Second
)

// Config configures a Driver.
type Config struct {
	// DriverName is the DRA driver's name, a DNS subdomain of at most 63
	// characters (such as gpu.example.com). Required.
	DriverName string
	// NodeName is the node the driver runs on. Required.
	NodeName string
	// PoolName is the pool of the node's devices. Default NodeName.
	PoolName string
	// PluginsDir is the kubelet's plugins directory; the driver serves
	// <PluginsDir>/<DriverName>/dra.sock (dra-<PodUID>.sock in a rolling
	// update) and keeps its checkpoint there. Default
	// /var/lib/kubelet/plugins.
	PluginsDir string
	// RegistryDir is the kubelet's plugin watcher directory; the driver
	// registers through <RegistryDir>/<DriverName>-reg.sock (a name with
	// the PodUID in a rolling update). Default
	// /var/lib/kubelet/plugins_registry.
	RegistryDir string
	// CDIDir is where CDI spec files are written for the container
	// runtime. Default /var/run/cdi.
	CDIDir string
	// SysfsRoot is where sysfs is mounted, read for the PCIe root of
	// devices with a PCI bus ID. Default /sys.
	SysfsRoot string
	// Client is the API server's: the helper reads the claims to prepare
	// through it and publishes the ResourceSlices. Required.
	Client kubernetes.Interface
	// NoSlices publishes no ResourceSlices (another component publishes
	// them).
	NoSlices bool
	// Retired serves only the claims an earlier instance prepared: the
	// resource is no longer served through DRA (its fronts lost dra)
	// while pods still hold claims. The driver publishes its pool empty,
	// so the scheduler allocates nothing new from it; it prepares again
	// only a claim its checkpoint lists (the kubelet does that after a
	// restart) and refuses any other, naming the change; and it
	// unprepares as ever, so the kubelet can end those pods. The
	// inventory keeps their devices from the device plugin front until
	// then.
	Retired bool
	// PodUID, when set, is the UID of the pod the driver runs in (the
	// downward API's metadata.uid) and turns on rolling updates: two
	// instances of the driver (a DaemonSet with maxSurge 1) serve at once
	// on sockets of their own, Prepare and Unprepare are serialized
	// between them through a file lock, and each reads what the other
	// prepared from the checkpoint. Leave it empty outside a pod.
	PodUID types.UID
	// Allocated, when set, has the driver hold the devices of the claims
	// the scheduler allocated from its pool from the allocation on, not
	// only from Prepare, so the device plugin front stops offering them
	// at once (reserveAllocated). Set it where both fronts serve one
	// resource; drivers of one process share one.
	Allocated *AllocatedClaims
	// HealthTimeout is how long a health report holds in the kubelet;
	// the driver reports every device at least every HealthTimeout/2.
	// Default 30s.
	HealthTimeout time.Duration
	// Logger receives the driver's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, when set, receives the driver's Prometheus metrics.
	Registerer prometheus.Registerer
	// Clock times health reports and retries. Default the real clock.
	Clock clock.WithTicker
}

func (c *Config) setDefaults() {
	if c.PoolName == "" {
		c.PoolName = c.NodeName
	}
	if c.PluginsDir == "" {
		c.PluginsDir = DefaultPluginsDir
	}
	if c.RegistryDir == "" {
		c.RegistryDir = DefaultRegistryDir
	}
	if c.CDIDir == "" {
		c.CDIDir = DefaultCDIDir
	}
	if c.SysfsRoot == "" {
		c.SysfsRoot = DefaultSysfsRoot
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
}

// validate reports every problem at once, each with its field.
func (c *Config) validate() error {
	var errs field.ErrorList
	p := field.NewPath("dra")
	switch {
	case c.DriverName == "":
		errs = append(errs, field.Required(p.Child("driverName"), "set the DRA driver's name, a DNS subdomain such as gpu.example.com"))
	case len(c.DriverName) > 63:
		errs = append(errs, field.TooLong(p.Child("driverName"), c.DriverName, 63))
	default:
		for _, msg := range validation.IsDNS1123Subdomain(c.DriverName) {
			errs = append(errs, field.Invalid(p.Child("driverName"), c.DriverName, msg+" (for example gpu.example.com)"))
		}
	}
	if c.NodeName == "" {
		errs = append(errs, field.Required(p.Child("nodeName"), "set the name of the node the driver runs on"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.PoolName) {
		if c.PoolName != "" {
			errs = append(errs, field.Invalid(p.Child("poolName"), c.PoolName, msg+"; leave it empty for the node's name"))
		}
	}
	for _, d := range []struct{ name, v string }{
		{"pluginsDir", c.PluginsDir}, {"registryDir", c.RegistryDir}, {"cdiDir", c.CDIDir}, {"sysfsRoot", c.SysfsRoot},
	} {
		if !filepath.IsAbs(d.v) {
			errs = append(errs, field.Invalid(p.Child(d.name), d.v, "must be an absolute path"))
		}
	}
	if c.Client == nil {
		errs = append(errs, field.Required(p.Child("client"), "pass the API server's client (kubernetes.NewForConfig)"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(string(c.PodUID)) {
		if c.PodUID != "" {
			errs = append(errs, field.Invalid(p.Child("podUID"), c.PodUID, msg+"; set the pod's metadata.uid (downward API) or leave it empty"))
		}
	}
	if c.HealthTimeout < 2*time.Second {
		errs = append(errs, field.Invalid(p.Child("healthTimeout"), c.HealthTimeout.String(), "must be at least 2s; leave it zero for the default 30s"))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid DRA driver configuration: %w", errs.ToAggregate())
}

// ErrNotPrepared is wrapped by errors about a claim the driver did not
// prepare.
var ErrNotPrepared = errors.New("claim not prepared")
