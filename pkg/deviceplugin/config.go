package deviceplugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"
)

// RegistrationMode selects how a plugin announces itself to the kubelet.
type RegistrationMode string

const (
	// RegistrationAuto uses the plugin watcher when the registry directory
	// exists and the kubelet's registration socket otherwise.
	RegistrationAuto RegistrationMode = "auto"
	// RegistrationKubelet calls Register on <PluginDir>/kubelet.sock.
	RegistrationKubelet RegistrationMode = "kubelet"
	// RegistrationRegistry places a pluginregistration v1 socket in the
	// kubelet's plugins_registry directory and lets the kubelet find it.
	RegistrationRegistry RegistrationMode = "registry"
	// RegistrationInProcess hands the plugin's service to a kubelet in
	// this process (Config.InProcess), with no socket. Chosen by setting
	// Config.InProcess; auto then resolves to it.
	RegistrationInProcess RegistrationMode = "in-process"
)

// InProcessKubelet is a kubelet side running in the plugin's own process
// that takes the plugin's DevicePlugin service without a socket:
// devicemanager.Manager, in dpkit node's in-process plugins. To it,
// registering is Register on kubelet.sock: it asks the options, consumes
// ListAndWatch, calls Allocate and the rest through api, and ends the
// stream when it drops the plugin, after which the SDK registers again as
// it does after a kubelet restart.
type InProcessKubelet interface {
	// ConnectInProcess registers resource, served through api; name
	// tells this instance apart from others of the resource.
	ConnectInProcess(ctx context.Context, resource, name string, api pluginapi.DevicePluginClient) error
}

// DefaultRegistryDir is where the kubelet's plugin watcher looks for sockets.
const DefaultRegistryDir = "/var/lib/kubelet/plugins_registry"

// Environment variables that hand a plugin its directories when its author
// set none in Config. dpkit verify sets them for the plugin it runs, so that
// a plugin written with the zero Config serves in verify's emulated kubelet
// directory instead of the node's. A directory set in Config always wins.
const (
	// EnvPluginDir is the default of Config.PluginDir.
	EnvPluginDir = "DPKIT_PLUGIN_DIR"
	// EnvRegistryDir is the default of Config.RegistryDir.
	EnvRegistryDir = "DPKIT_REGISTRY_DIR"
)

// KubeletMaxMessageSize is the largest message the kubelet accepts on a
// ListAndWatch stream (the gRPC default receive limit, 4 MiB).
const KubeletMaxMessageSize = 4 << 20

// Config configures a Server. The zero value serves in the kubelet's
// default directories and registers automatically.
type Config struct {
	// PluginDir is the kubelet's device plugin directory: where plugin
	// sockets are created and kubelet.sock is found. Default
	// $DPKIT_PLUGIN_DIR when set (dpkit verify sets it), else
	// /var/lib/kubelet/device-plugins/.
	PluginDir string
	// KubeletSocket is the kubelet's registration socket. Default
	// <PluginDir>/kubelet.sock.
	KubeletSocket string
	// Registration selects the registration path. Default auto.
	Registration RegistrationMode
	// InProcess, when set, is the kubelet the plugin registers with,
	// in this process and without sockets (RegistrationInProcess): no
	// socket is served and no directory watched. Registration must then
	// be auto or in-process.
	InProcess InProcessKubelet
	// RegistryDir is the kubelet's plugin watcher directory. Default
	// $DPKIT_REGISTRY_DIR when set (dpkit verify --plugin-watcher sets
	// it), else the plugins_registry directory beside PluginDir, which is
	// /var/lib/kubelet/plugins_registry for the default PluginDir.
	RegistryDir string
	// InstanceID distinguishes this process's sockets from those of other
	// instances of the same plugin (a rolling update runs two at once).
	// Default: random.
	InstanceID string
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger
	// Registerer, when set, receives the server's Prometheus metrics.
	Registerer prometheus.Registerer
	// RetryMin and RetryMax bound the jittered exponential back-off between
	// failed registrations. Defaults 50ms and 5s.
	RetryMin, RetryMax time.Duration
	// RegisterTimeout bounds one Register call. The kubelet dials the
	// plugin for up to 10s inside it. Default 15s.
	RegisterTimeout time.Duration
	// ShutdownTimeout bounds how long shutdown waits for in-flight RPCs.
	// Default 10s.
	ShutdownTimeout time.Duration
	// FirstScanWait is how long registration (and, in registry mode,
	// where the kubelet's plugin watcher may find the socket before the
	// first scan, the first ListAndWatch message) waits for the plugin's
	// first device list, so the kubelet's first ListAndWatch message is
	// full; after it the plugin registers with what it has. Default 5s.
	FirstScanWait time.Duration
	// StreamEndedGuard is how long after a registration a ListAndWatch
	// stream that ends is taken for the kubelet's previous connection
	// rather than a reason to register again (no registration storm).
	// Default 1s.
	StreamEndedGuard time.Duration
	// ResyncInterval is how often the server checks, as a safety net
	// behind fsnotify, that its sockets are in place and registered.
	// Default 10s.
	ResyncInterval time.Duration
	// Clock times everything above. Default the real clock; tests pass a
	// fake one (k8s.io/utils/clock/testing).
	Clock clock.WithTicker

	// pluginDirFrom names the environment variable PluginDir was taken
	// from, for validation errors.
	pluginDirFrom string
}

// Dirs returns the device plugin directory and the plugin watcher
// directory c resolves to: the ones set, else $DPKIT_PLUGIN_DIR and
// $DPKIT_REGISTRY_DIR, else the kubelet's.
func (c Config) Dirs() (pluginDir, registryDir string) {
	d := c.withDefaults()
	return d.PluginDir, d.RegistryDir
}

func (c Config) withDefaults() Config {
	if c.PluginDir == "" {
		if dir := os.Getenv(EnvPluginDir); dir != "" {
			c.PluginDir, c.pluginDirFrom = dir, EnvPluginDir
		} else {
			c.PluginDir = pluginapi.DevicePluginPath
		}
	}
	if c.KubeletSocket == "" {
		c.KubeletSocket = filepath.Join(c.PluginDir, filepath.Base(pluginapi.KubeletSocket))
	}
	if c.Registration == "" {
		c.Registration = RegistrationAuto
	}
	if c.RegistryDir == "" {
		if dir := os.Getenv(EnvRegistryDir); dir != "" {
			c.RegistryDir = dir
		} else {
			// The kubelet keeps both directories under its root directory.
			c.RegistryDir = filepath.Join(filepath.Dir(filepath.Clean(c.PluginDir)), filepath.Base(DefaultRegistryDir))
		}
	}
	if c.InstanceID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.InstanceID = hex.EncodeToString(b[:])
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.RegisterTimeout <= 0 {
		c.RegisterTimeout = 15 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.FirstScanWait <= 0 {
		c.FirstScanWait = 5 * time.Second
	}
	if c.StreamEndedGuard <= 0 {
		c.StreamEndedGuard = time.Second
	}
	if c.ResyncInterval <= 0 {
		c.ResyncInterval = 10 * time.Second
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

func (c Config) validate(resources []Resource) error {
	var errs []error
	if !filepath.IsAbs(c.PluginDir) {
		errs = append(errs, fmt.Errorf("PluginDir: %q%s must be an absolute path", c.PluginDir, from(c.pluginDirFrom)))
	}
	switch c.Registration {
	case RegistrationAuto, RegistrationKubelet, RegistrationRegistry, RegistrationInProcess:
	default:
		errs = append(errs, fmt.Errorf("config.Registration: unknown mode %q; use auto, kubelet or registry", c.Registration))
	}
	switch {
	case c.Registration == RegistrationInProcess && c.InProcess == nil:
		errs = append(errs, errors.New("config.Registration: in-process needs config.InProcess, the kubelet in this process to register with; set it, or use auto, kubelet or registry"))
	case c.InProcess != nil && c.Registration != RegistrationAuto && c.Registration != RegistrationInProcess:
		errs = append(errs, fmt.Errorf("config.InProcess: set with Registration %q, which registers through a socket; leave Registration auto, or unset InProcess", c.Registration))
	}
	if c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("RetryMax: %s is below RetryMin %s", c.RetryMax, c.RetryMin))
	}
	if len(resources) == 0 {
		errs = append(errs, errors.New("resources: at least one resource is needed"))
	}
	seen := make(map[string]bool)
	for i, r := range resources {
		if err := ValidateResourceName(r.Name); err != nil {
			errs = append(errs, fmt.Errorf("resources[%d].Name: %w", i, err))
		}
		if r.Plugin == nil {
			errs = append(errs, fmt.Errorf("resources[%d].Plugin: is nil; set the Plugin that serves %q", i, r.Name))
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("resources[%d].Name: %q is served twice; one process serves each resource once", i, r.Name))
		}
		seen[r.Name] = true
	}
	return errors.Join(errs...)
}

// from says which environment variable a value came from, if any.
func from(env string) string {
	if env == "" {
		return ""
	}
	return " (from $" + env + ")"
}

// registryMode resolves auto to the mode actually used.
func (c Config) registryMode() RegistrationMode {
	if c.InProcess != nil {
		return RegistrationInProcess
	}
	if c.Registration != RegistrationAuto {
		return c.Registration
	}
	if fi, err := os.Stat(c.RegistryDir); err == nil && fi.IsDir() {
		return RegistrationRegistry
	}
	return RegistrationKubelet
}
