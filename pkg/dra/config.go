// Package dra serves an inventory's devices (pkg/inventory) as a DRA
// driver on the kubelet's own gRPC APIs: plugin registration
// (pluginregistration/v1), DRAPlugin (dra/v1) and DRAResourceHealth
// (dra-health/v1). It publishes the devices in ResourceSlices, prepares
// claims by calling the plugin's Allocate and turning the answer into a
// CDI spec, checkpoints what it prepared, and streams device health.
//
// A device is never given out through DRA and the device plugin front at
// once: both acquire it in the inventory's arbiter first.
package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
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

// ClaimGetter reads the ResourceClaims the kubelet asks the driver to
// prepare. The method is the one dramanager.ClaimGetter has, so one
// implementation serves both sides (dratest.Claims is one).
type ClaimGetter interface {
	GetResourceClaim(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error)
}

// SlicePublisher publishes the devices of the driver's pool on this node.
// Publish is called with the full list on every change; an implementation
// splits it into ResourceSlices and bumps the pool's generation.
type SlicePublisher interface {
	Publish(ctx context.Context, pool string, devices []resourcev1.Device) error
}

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
	// <PluginsDir>/<DriverName>/dra.sock and keeps its checkpoint there.
	// Default /var/lib/kubelet/plugins.
	PluginsDir string
	// RegistryDir is the kubelet's plugin watcher directory; the driver
	// registers through <RegistryDir>/<DriverName>-reg.sock. Default
	// /var/lib/kubelet/plugins_registry.
	RegistryDir string
	// CDIDir is where CDI spec files are written for the container
	// runtime. Default /var/run/cdi.
	CDIDir string
	// SysfsRoot is where sysfs is mounted, read for the PCIe root of
	// devices with a PCI bus ID. Default /sys.
	SysfsRoot string
	// Claims reads the claims to prepare. Required.
	Claims ClaimGetter
	// Slices publishes the devices; nil publishes nothing (another
	// component publishes them, or a test does not need them).
	Slices SlicePublisher
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
	if c.Claims == nil {
		errs = append(errs, field.Required(p.Child("claims"), "pass a ClaimGetter, such as dra.APIClaims(client)"))
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
