package devicemanager

import (
	"errors"
	"log/slog"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/pkg/topology"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultGracePeriod     = 5 * time.Minute
	DefaultAllocateTimeout = 30 * time.Second
	DefaultPreStartTimeout = 30 * time.Second
	DefaultDialTimeout     = 10 * time.Second
)

// Config configures a Manager.
type Config struct {
	// Root is the directory that stands for the kubelet's root directory.
	// The registration socket is Root/device-plugins/kubelet.sock and the
	// checkpoint Root/device-plugins/kubelet_internal_checkpoint.
	// Required; must be absolute.
	Root string
	// Logger receives the manager's logs; nil discards them.
	Logger *slog.Logger
	// TopologyPolicy is one of none (default), best-effort, restricted,
	// single-numa-node.
	TopologyPolicy string
	// TopologyScope is container (default) or pod.
	TopologyScope string
	// NUMANodes lists the machine's NUMA node IDs. Required for topology
	// policies other than none.
	NUMANodes []int
	// GracePeriod is how long a resource whose plugins are all gone stays
	// listed (with zero allocatable) before it is removed. Default 5m.
	GracePeriod time.Duration
	// AllocateTimeout bounds each Allocate and GetPreferredAllocation call.
	// Default 30s.
	AllocateTimeout time.Duration
	// PreStartTimeout bounds each PreStartContainer call. Default 30s.
	PreStartTimeout time.Duration
	// DialTimeout bounds connecting to a registering plugin. Default 10s.
	DialTimeout time.Duration
	// AdmissionWait, when positive, holds a pod's admission up to that
	// long while a resource it requests is known but its plugin does not
	// serve it: restored from the checkpoint after a restart, or whose
	// plugins all went away within GracePeriod, and not yet registered
	// and listed again. The kubelet does not wait: it refuses such a pod
	// at once (UnexpectedAdmissionError) and it fails for good. Zero (the
	// default) is the kubelet's behaviour.
	AdmissionWait time.Duration
	// Clock drives the grace period and the admission wait; nil means
	// the real clock.
	Clock clock.WithTicker
}

// PluginDir returns the device plugin directory under root.
func PluginDir(root string) string { return filepath.Join(root, "device-plugins") }

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TopologyPolicy == "" {
		c.TopologyPolicy = topology.PolicyNone
	}
	if c.TopologyScope == "" {
		c.TopologyScope = topology.ScopeContainer
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = DefaultGracePeriod
	}
	if c.AllocateTimeout == 0 {
		c.AllocateTimeout = DefaultAllocateTimeout
	}
	if c.PreStartTimeout == 0 {
		c.PreStartTimeout = DefaultPreStartTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
}

// Validate reports every problem of c at once, each with its field path.
// It expects defaults to be applied (New does that).
func (c *Config) Validate() error {
	var errs field.ErrorList
	p := field.NewPath("config")
	switch {
	case c.Root == "":
		errs = append(errs, field.Required(p.Child("root"), "set the directory that stands for the kubelet root, e.g. /var/lib/kubelet"))
	case !filepath.IsAbs(c.Root):
		errs = append(errs, field.Invalid(p.Child("root"), c.Root, "must be an absolute path"))
	default:
		// unix socket paths are limited to 108 bytes.
		if sock := filepath.Join(PluginDir(c.Root), "kubelet.sock"); len(sock) >= 108 {
			errs = append(errs, field.Invalid(p.Child("root"), c.Root, "too long: the registration socket path "+sock+" must be shorter than 108 bytes"))
		}
	}
	switch c.TopologyScope {
	case topology.ScopeContainer, topology.ScopePod:
	default:
		errs = append(errs, field.NotSupported(p.Child("topologyScope"), c.TopologyScope, []string{topology.ScopeContainer, topology.ScopePod}))
	}
	if _, err := topology.NewPolicy(c.TopologyPolicy, c.NUMANodes); err != nil {
		errs = append(errs, field.Invalid(p.Child("topologyPolicy"), c.TopologyPolicy, err.Error()))
	}
	if c.AdmissionWait < 0 {
		errs = append(errs, field.Invalid(p.Child("admissionWait"), c.AdmissionWait.String(), "must not be negative; 0 refuses at once, as the kubelet"))
	}
	for i, n := range c.NUMANodes {
		if n < 0 || n >= topology.MaxNUMANodes {
			errs = append(errs, field.Invalid(p.Child("numaNodes").Index(i), n, "NUMA node IDs must be in [0, 64)"))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"gracePeriod", c.GracePeriod}, {"allocateTimeout", c.AllocateTimeout}, {"preStartTimeout", c.PreStartTimeout}, {"dialTimeout", c.DialTimeout}} {
		if d.v < 0 {
			errs = append(errs, field.Invalid(p.Child(d.name), d.v.String(), "must not be negative; leave it zero for the default"))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(errs.ToAggregate().Errors()...)
}
