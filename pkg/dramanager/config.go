package dramanager

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"
)

// Defaults applied by New to zero Config fields: the kubelet's.
const (
	// DefaultCallTimeout bounds every NodePrepareResources and
	// NodeUnprepareResources call (the kubelet's defaultClientCallTimeout,
	// half its retry period).
	DefaultCallTimeout = 45 * time.Second
	// DefaultHealthTimeout is how long a device's last health report
	// holds when the driver sets no timeout of its own; after it the
	// device is Unknown.
	DefaultHealthTimeout = 30 * time.Second
	// DefaultReconcilePeriod is how often claims of pods that are no
	// longer active are unprepared.
	DefaultReconcilePeriod = 60 * time.Second
	// DefaultHealthRetryPeriod is the wait before a health stream that
	// ended is opened again.
	DefaultHealthRetryPeriod = 5 * time.Second
)

// HealthStateFile is the device health cache's file name in the root.
const HealthStateFile = "dra_health_state"

// ClaimGetter gives the manager the ResourceClaims pods reference, with
// their allocation and reservations: the kubelet reads them from the API
// server; a node backed by one passes a client, tests pass a map.
type ClaimGetter interface {
	// GetResourceClaim returns the claim with that namespace and name.
	GetResourceClaim(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error)
}

// Config configures a Manager.
type Config struct {
	// Root is the directory that stands for the kubelet's root directory:
	// the checkpoint is Root/dra_manager_state and the health cache
	// Root/dra_health_state. Required; must be absolute.
	Root string
	// Claims supplies the ResourceClaims of the pods to prepare. Without
	// it, preparing a pod that references a claim fails with an error
	// that says so; pods without claims need nothing.
	Claims ClaimGetter
	// ActivePods lists the pods the node runs, for the reconcile loop
	// that unprepares the claims of pods that are gone. Nil leaves
	// reconciling to the caller (Reconcile).
	ActivePods func() []*corev1.Pod
	// Logger receives the manager's logs; nil discards them.
	Logger *slog.Logger
	// Clock drives health timeouts, the reconcile loop and the health
	// stream's retries; nil means the real clock. (gRPC call deadlines
	// are real time.)
	Clock clock.WithTickerAndDelayedExecution
	// CallTimeout bounds each call to a driver. Default 45s.
	CallTimeout time.Duration
	// HealthTimeout is the default validity of a health report. Default 30s.
	HealthTimeout time.Duration
	// ReconcilePeriod is the reconcile loop's period. Default 60s.
	ReconcilePeriod time.Duration
	// HealthRetryPeriod is the wait before reopening a health stream.
	// Default 5s.
	HealthRetryPeriod time.Duration
	// Slices wipes the ResourceSlices the node's drivers published: all
	// of them when Start is called (no driver has registered yet, and
	// pods must not be scheduled on devices whose driver may never come
	// back), and those of a driver that stays unusable (no plugin
	// registered and connected) for WipingDelay. Nil wipes nothing.
	Slices SliceWiper
	// WipingDelay is how long a driver may stay unusable before its
	// ResourceSlices are wiped. Default 30s, the kubelet's.
	WipingDelay time.Duration
	// Registerer, when set, receives the kubelet's DRA metrics:
	// dra_operations_duration_seconds, dra_grpc_operations_duration_seconds
	// and dra_resource_claims_in_use. A registry takes one manager's.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.ReconcilePeriod == 0 {
		c.ReconcilePeriod = DefaultReconcilePeriod
	}
	if c.HealthRetryPeriod == 0 {
		c.HealthRetryPeriod = DefaultHealthRetryPeriod
	}
	if c.WipingDelay == 0 {
		c.WipingDelay = DefaultWipingDelay
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
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"callTimeout", c.CallTimeout},
		{"healthTimeout", c.HealthTimeout},
		{"reconcilePeriod", c.ReconcilePeriod},
		{"healthRetryPeriod", c.HealthRetryPeriod},
		{"wipingDelay", c.WipingDelay},
	} {
		if d.v < 0 {
			errs = append(errs, field.Invalid(p.Child(d.name), d.v.String(), "must not be negative; leave it zero for the default"))
		}
	}
	return errs.ToAggregate()
}
