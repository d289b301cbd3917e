package draplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/fswatch"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// Driver is a DRA driver serving one inventory. It implements
// kubeletplugin.DRAPlugin; Run starts the helper with it.
type Driver struct {
	cfg     Config
	inv     *inventory.Inventory
	log     *slog.Logger
	metrics *metrics

	regSock, endpoint, checkpointPath string

	// mu guards prepared. The helper serializes Prepare and Unprepare
	// (between instances too, in a rolling update); mu also orders them
	// with New's restore.
	mu       sync.Mutex
	prepared map[string]*preparedClaim // claim UID -> what was prepared
	// unprepared are the claims unprepared here that may still be
	// allocated: reserveAllocated does not hold them again (with
	// Config.Allocated only; reserve forgets a claim once it is no
	// longer allocated).
	unprepared map[string]bool

	statusMu      sync.Mutex
	status        *registerapi.RegistrationStatus
	statusChanged broadcast.Change

	// fatal receives the first error the helper calls fatal (a gRPC
	// server that stopped serving); Run returns it.
	fatal chan error
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New validates cfg, applies its defaults and returns a driver for inv.
// It reads the checkpoint of an earlier run (a corrupt one is an error
// naming the file), acquires the devices of the claims it lists in the
// inventory and writes their CDI specs again where they are gone.
func New(cfg Config, inv *inventory.Inventory) (*Driver, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, errors.New("draplugin.New: the inventory is nil; pass inventory.New(resource, plugin, log)")
	}
	dataDir := filepath.Join(cfg.PluginsDir, cfg.DriverName)
	d := &Driver{
		cfg:            cfg,
		inv:            inv,
		log:            cfg.Logger.With("driver", cfg.DriverName),
		regSock:        filepath.Join(cfg.RegistryDir, cfg.DriverName+"-reg.sock"),
		endpoint:       filepath.Join(dataDir, "dra.sock"),
		checkpointPath: filepath.Join(dataDir, CheckpointFile),
		fatal:          make(chan error, 1),
	}
	if cfg.PodUID != "" {
		// The helper's names for the sockets of one instance of a
		// rolling update.
		d.regSock = kubeletplugin.RollingUpdateRegistrarSocketFile(cfg.RegistryDir, cfg.DriverName, cfg.PodUID)
		if !filepath.IsAbs(d.regSock) {
			d.regSock = filepath.Join(cfg.RegistryDir, d.regSock)
		}
		d.endpoint = filepath.Join(dataDir, "dra-"+string(cfg.PodUID)+".sock")
	}
	m, err := newMetrics(cfg.Registerer, cfg.DriverName)
	if err != nil {
		return nil, err
	}
	d.metrics = m
	prepared, err := readCheckpoint(d.checkpointPath)
	if err != nil {
		return nil, err
	}
	d.prepared = prepared
	d.unprepared = map[string]bool{}
	// Hold the checkpointed claims' devices before anything else can give
	// them out (the device plugin front may run already).
	d.restore()
	return d, nil
}

// PreparedClaims returns how many claims the driver has prepared (its
// checkpoint lists).
func (d *Driver) PreparedClaims() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.prepared)
}

// Endpoint returns the path of the driver's DRAPlugin socket.
func (d *Driver) Endpoint() string { return d.endpoint }

// RegistrationSocket returns the path of the driver's registration socket.
func (d *Driver) RegistrationSocket() string { return d.regSock }

// RegistrationStatus returns what the kubelet last said about the
// registration, nil before it said anything.
func (d *Driver) RegistrationStatus() *registerapi.RegistrationStatus {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	return d.status
}

// Ready returns nil once the kubelet has registered the driver, and
// otherwise why it is not ready: what a readiness probe reports (a pod
// prepared before its driver registers waits for the kubelet's next
// sync of the pod, up to a minute).
func (d *Driver) Ready() error {
	st := d.RegistrationStatus()
	switch {
	case st == nil:
		return fmt.Errorf("DRA driver %s: not registered with the kubelet yet (registration socket %s)", d.cfg.DriverName, d.regSock)
	case !st.PluginRegistered:
		return fmt.Errorf("DRA driver %s: the kubelet refused the registration: %s", d.cfg.DriverName, st.Error)
	}
	return nil
}

// RegistrationChanged returns a channel closed when the kubelet next says
// something about the registration. Take it before reading
// RegistrationStatus.
func (d *Driver) RegistrationChanged() <-chan struct{} { return d.statusChanged.C() }

// Run starts the helper (registration, the DRA and health services) and
// publishes the devices until ctx ends; then it stops the helper, which
// removes its sockets. Run the inventory (inventory.Run) beside it. It
// returns an error when the helper cannot start or a gRPC server fails.
func (d *Driver) Run(ctx context.Context) error {
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(d.log.Handler()))
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(d.cfg.DriverName),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.KubeClient(d.cfg.Client),
		kubeletplugin.PluginDataDirectoryPath(filepath.Dir(d.endpoint)),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistryDir),
		kubeletplugin.GRPCInterceptor(d.intercept),
	}
	if d.cfg.PodUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(d.cfg.PodUID))
	}
	// The helper listens where it is told; the kubelet makes its
	// registry directory, but the driver's own may not exist yet.
	for _, dir := range []string{filepath.Dir(d.endpoint), d.cfg.RegistryDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
		}
	}
	h, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
	}
	defer h.Stop()
	d.log.Info("DRA driver serving", "endpoint", d.endpoint, "registration", d.regSock, "rollingUpdate", d.cfg.PodUID != "")

	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	if !d.cfg.NoSlices {
		wg.Go(func() { d.publishLoop(ctx) })
	}
	if d.cfg.Allocated != nil {
		wg.Go(func() { d.reserveAllocated(ctx) })
	}
	if d.cfg.PodUID != "" {
		if err := d.followCheckpoint(ctx, &wg); err != nil {
			return fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-d.fatal:
		return fmt.Errorf("DRA driver %s: %w", d.cfg.DriverName, err)
	}
}

// intercept records what the kubelet says about the registration (the
// helper keeps it without telling anyone) and counts the claims of each
// call.
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if st, ok := req.(*registerapi.RegistrationStatus); ok && err == nil {
		d.statusMu.Lock()
		d.status = st
		d.statusMu.Unlock()
		d.statusChanged.Broadcast()
		if st.PluginRegistered {
			d.log.Info("Registered with the kubelet")
		} else {
			d.log.Error("The kubelet refused the registration", "err", st.Error)
		}
	}
	return resp, err
}

// HandleError is called by the helper for errors in the background. A
// ResourceSlice the API server stored without some fields (a feature off
// on the cluster) is logged with the features, and the controller adopts
// what was stored instead of writing it again every sync; other
// recoverable errors (publishing, stale health) are logged and retried by
// the helper; anything the helper calls fatal ends Run.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	switch {
	case errors.As(err, &dropped):
		d.metrics.background.WithLabelValues("dropped_fields").Inc()
		d.log.Error("The API server dropped fields of a ResourceSlice: the devices are published without them (an unhealthy device's taint, for one, is then not there for the scheduler; turn the feature on in the cluster)",
			"pool", dropped.PoolName, "slice", dropped.SliceIndex, "features", dropped.DisabledFeatures())
	case errors.Is(err, kubeletplugin.ErrRecoverable):
		d.metrics.background.WithLabelValues("recoverable").Inc()
		d.log.Error("The DRA helper reported an error", "what", msg, "err", err)
	default:
		d.metrics.background.WithLabelValues("fatal").Inc()
		d.log.Error("The DRA helper reported an error", "what", msg, "err", err)
		select {
		case d.fatal <- fmt.Errorf("%s: %w", msg, err):
		default:
		}
	}
}

// followCheckpoint reads the checkpoint again whenever it is written, in
// a rolling update: a claim the other instance prepares holds its devices
// here too at once, so this instance's device plugin front cannot give
// them to a container before this instance's next DRA call.
func (d *Driver) followCheckpoint(ctx context.Context, wg *sync.WaitGroup) error {
	fsw, err := fswatch.New()
	if err != nil {
		return fmt.Errorf("watch the checkpoint: %w", err)
	}
	if err := fsw.Add(filepath.Dir(d.checkpointPath)); err != nil {
		_ = fsw.Close()
		return fmt.Errorf("watch %s: %w", filepath.Dir(d.checkpointPath), err)
	}
	wg.Go(func() {
		defer func() { _ = fsw.Close() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-fsw.Events:
				if !ok {
					return
				}
				if ev.Name != d.checkpointPath || !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) && !ev.Has(fsnotify.Rename) {
					continue
				}
				d.rereadCheckpoint()
			case err, ok := <-fsw.Errors:
				if !ok {
					return
				}
				d.log.Warn("Watching the checkpoint", "err", err)
				if errors.Is(err, fsnotify.ErrEventOverflow) {
					d.rereadCheckpoint() // events were lost: one may have been the checkpoint's
				}
			}
		}
	})
	return nil
}

// rereadCheckpoint takes in what the other instance wrote.
func (d *Driver) rereadCheckpoint() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncLocked(); err != nil {
		d.log.Error("Reading the checkpoint the other instance wrote", "err", err)
	}
}
