// Package fakedra is a DRA driver for tests and demos, built on the
// upstream driver helper (k8s.io/dynamic-resource-allocation/kubeletplugin)
// so that what talks to a DRA manager is what real drivers run. It serves
// a scripted list of devices, reports their health as the test sets it,
// fails Prepare or Unprepare on demand and records every call.
//
// The helper reads the claims it prepares through a client: an API
// server's, or a client-go fake clientset that holds the same claims as
// the manager's ClaimGetter. Command dpkit-fakedra (cmd/dpkit-fakedra)
// runs it as a process, and dpkit's tests run that (pkg/dramanager/dratest).
package fakedra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// change is a "something changed" signal for many waiters.
type change struct {
	mu sync.Mutex
	ch chan struct{}
}

func (c *change) C() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

func (c *change) Broadcast() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

// DefaultDriverName is the driver's name when Config leaves it empty.
const DefaultDriverName = "fake.dpkit.io"

// Config configures a Driver.
type Config struct {
	// DriverName is the DRA driver name. Default DefaultDriverName.
	DriverName string
	// RegistryDir is the kubelet's plugins_registry directory. Required.
	RegistryDir string
	// PluginDir holds the driver's service socket dra.sock. Required.
	PluginDir string
	// Pool is the name of the pool the devices are in. Default "pool".
	Pool string
	// Devices are the names of the devices served.
	Devices []string
	// Client is where the helper reads ResourceClaims. Required.
	Client kubernetes.Interface
	// RollingUpdate, when set, registers as a rolling-update instance
	// (a registration socket and a service socket of its own).
	RollingUpdate types.UID
	// NoHealth makes the driver decline health reporting (the health
	// service answers Unimplemented).
	NoHealth bool
	// ResendEvery is how often the health report is sent again without a
	// change, so that it never goes stale (the kubelet shows a device
	// Unknown 30s after its last report). Default 10s.
	ResendEvery time.Duration
	// NodeName, when set, is the node the driver runs for: it publishes
	// one ResourceSlice of its devices for that node through Client (an
	// API server's client then), as a real driver does, and the slice
	// is removed when the driver stops.
	NodeName string
	// Options are passed to kubeletplugin.Start after the driver's own
	// (NodeV1(false), HealthV1(false), ...).
	Options []kubeletplugin.Option
}

// Call is one NodePrepareResources or NodeUnprepareResources call the
// driver received: its method and the claims' UIDs.
type Call struct {
	Method string      `json:"method"`
	Claims []types.UID `json:"claims"`
}

// Driver is a running fake DRA driver.
type Driver struct {
	cfg    Config
	helper *kubeletplugin.Helper

	mu            sync.Mutex
	calls         []Call
	failPrepare   string
	failUnprepare string
	health        map[string]kubeletplugin.DeviceHealth
	changed       change // calls or health changed
	healthChanged change
}

// CDIDeviceID is the CDI device ID the driver gives device.
func CDIDeviceID(driver, device string) string { return driver + "/device=" + device }

// Start starts the driver and registers it through RegistryDir.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if cfg.Pool == "" {
		cfg.Pool = "pool"
	}
	if cfg.ResendEvery <= 0 {
		cfg.ResendEvery = 10 * time.Second
	}
	var errs []error
	if cfg.RegistryDir == "" {
		errs = append(errs, errors.New("fakedra: set Config.RegistryDir, the kubelet's plugins_registry directory"))
	}
	if cfg.PluginDir == "" {
		errs = append(errs, errors.New("fakedra: set Config.PluginDir, the directory of the driver's service socket"))
	}
	if cfg.Client == nil {
		errs = append(errs, errors.New("fakedra: set Config.Client, where the driver reads ResourceClaims"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, health: map[string]kubeletplugin.DeviceHealth{}}
	for _, dev := range cfg.Devices {
		d.health[dev] = kubeletplugin.DeviceHealth{PoolName: cfg.Pool, DeviceName: dev, Health: kubeletplugin.HealthStatusHealthy}
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.KubeClient(cfg.Client),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistryDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir),
	}
	if cfg.RollingUpdate != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(cfg.RollingUpdate))
	}
	if cfg.NodeName != "" {
		opts = append(opts, kubeletplugin.NodeName(cfg.NodeName))
	}
	opts = append(opts, cfg.Options...)
	h, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return nil, fmt.Errorf("fakedra: %w", err)
	}
	d.helper = h
	if cfg.NodeName != "" {
		devices := make([]resourcev1.Device, 0, len(cfg.Devices))
		for _, name := range cfg.Devices {
			devices = append(devices, resourcev1.Device{Name: name})
		}
		err := h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			cfg.Pool: {Slices: []resourceslice.Slice{{Devices: devices}}},
		}})
		if err != nil {
			h.Stop()
			return nil, fmt.Errorf("fakedra: publish the ResourceSlice of node %s: %w", cfg.NodeName, err)
		}
	}
	return d, nil
}

// Stop stops the driver; its registration socket is removed.
func (d *Driver) Stop() { d.helper.Stop() }

// RegistrationStatus is what the kubelet last told the driver about its
// registration (nil before it did).
func (d *Driver) RegistrationStatus() (registered bool, message string, known bool) {
	s := d.helper.RegistrationStatus()
	if s == nil {
		return false, "", false
	}
	return s.PluginRegistered, s.Error, true
}

// Calls returns the calls received so far.
func (d *Driver) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// Changed is closed at the next call received or health change.
func (d *Driver) Changed() <-chan struct{} { return d.changed.C() }

// FailPrepare makes every claim's prepare fail with msg; "" heals.
func (d *Driver) FailPrepare(msg string) {
	d.mu.Lock()
	d.failPrepare = msg
	d.mu.Unlock()
}

// FailUnprepare makes every claim's unprepare fail with msg; "" heals.
func (d *Driver) FailUnprepare(msg string) {
	d.mu.Lock()
	d.failUnprepare = msg
	d.mu.Unlock()
}

// SetHealth sets a device's health and sends a report of every device to
// the kubelet.
func (d *Driver) SetHealth(device string, h kubeletplugin.HealthStatus, message string) {
	d.mu.Lock()
	d.health[device] = kubeletplugin.DeviceHealth{PoolName: d.cfg.Pool, DeviceName: device, Health: h, Message: message}
	d.mu.Unlock()
	d.healthChanged.Broadcast()
	d.changed.Broadcast()
}

func (d *Driver) record(method string, uids []types.UID) {
	d.mu.Lock()
	d.calls = append(d.calls, Call{Method: method, Claims: uids})
	d.mu.Unlock()
	d.changed.Broadcast()
}

// PrepareResourceClaims gives every device allocated to the driver in
// each claim one CDI device ID.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	uids := make([]types.UID, 0, len(claims))
	for _, c := range claims {
		uids = append(uids, c.UID)
	}
	d.record("NodePrepareResources", uids)
	d.mu.Lock()
	fail := d.failPrepare
	d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		if fail != "" {
			out[c.UID] = kubeletplugin.PrepareResult{Err: errors.New(fail)}
			continue
		}
		var res kubeletplugin.PrepareResult
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != d.cfg.DriverName {
				continue
			}
			if r.Pool != d.cfg.Pool || !slices.Contains(d.cfg.Devices, r.Device) {
				res.Err = fmt.Errorf("device %s/%s is not one of this driver's", r.Pool, r.Device)
				break
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				CDIDeviceIDs: []string{CDIDeviceID(d.cfg.DriverName, r.Device)}, ShareID: r.ShareID,
			})
		}
		out[c.UID] = res
	}
	return out, nil
}

// UnprepareResourceClaims succeeds for every claim unless told to fail.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	uids := make([]types.UID, 0, len(claims))
	for _, c := range claims {
		uids = append(uids, c.UID)
	}
	d.record("NodeUnprepareResources", uids)
	d.mu.Lock()
	fail := d.failUnprepare
	d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
		if fail != "" {
			out[c.UID] = errors.New(fail)
		}
	}
	return out, nil
}

// HandleError logs the helper's background errors (publishing the
// ResourceSlice) to the driver's log.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus sends a report of every device now, after every
// change and every ResendEvery, until ctx ends.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.cfg.NoHealth {
		return kubeletplugin.ErrHealthNotSupported
	}
	resend := time.NewTicker(d.cfg.ResendEvery)
	defer resend.Stop()
	for {
		changed := d.healthChanged.C()
		d.mu.Lock()
		rep := kubeletplugin.DeviceHealthReport{}
		for _, dev := range d.cfg.Devices {
			h := d.health[dev]
			h.LastUpdated = time.Now()
			rep.Devices = append(rep.Devices, h)
		}
		d.mu.Unlock()
		select {
		case reports <- rep:
		case <-ctx.Done():
			return nil
		}
		select {
		case <-changed:
		case <-resend.C:
		case <-ctx.Done():
			return nil
		}
	}
}
