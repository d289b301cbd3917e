// Package process is the virtual node backend that runs each container's
// command and args as a host process: no image, no isolation. Container
// output goes through named pipes into per-container log files in the
// CRI log format, so processes keep running (and their logs keep being
// collected) across a restart of the node; pod and process state are
// persisted under Config.Dir and adopted by the next run.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Defaults of Config fields left zero.
const (
	DefaultBackoffInitial = podruntime.DefaultBackoffInitial
	DefaultBackoffMax     = podruntime.DefaultBackoffMax
	DefaultShell          = "/bin/sh"
	DefaultGracePeriod    = podruntime.DefaultGracePeriod
	// The kubelet's defaults for containerLogMaxSize and
	// containerLogMaxFiles.
	DefaultContainerLogMaxSize  = 10 << 20
	DefaultContainerLogMaxFiles = 5
)

// Config configures the process backend.
type Config struct {
	backend.Config
	// Dir holds one directory per pod: its state, named pipes, exit
	// files and logs. Required.
	Dir string
	// BackoffInitial and BackoffMax bound the restart back-off, doubled
	// after each failed run like the kubelet's (10s up to 5m).
	BackoffInitial, BackoffMax time.Duration
	// Shell runs the small wrapper that records each container's exit
	// code. Default /bin/sh.
	Shell string
	// PollInterval is how often adopted processes (started by a previous
	// run) are checked and followed logs are read. Default 200ms.
	PollInterval time.Duration
	// ContainerLogMaxSize is the size at which a container's log file is
	// rotated, and ContainerLogMaxFiles how many files (the current one
	// included) are kept per container run, like the kubelet's
	// containerLogMaxSize and containerLogMaxFiles. Defaults 10 MiB and 5.
	ContainerLogMaxSize  int64
	ContainerLogMaxFiles int
	// CDISpecDirs are where the CDI specs of containers' CDI devices are
	// read, for the environment they give (a container runtime's
	// cdi_spec_dirs). None: CDI devices give no environment.
	CDISpecDirs []string

	// probeTicker, when set, paces the probe workers instead of their
	// period, the first probe included (tests).
	probeTicker podruntime.Ticker
}

// Backend is the process backend.
type Backend struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	pods podruntime.Workers[*podRun]

	// isoMu guards noPIDNamespace, set once creating a PID namespace
	// was refused (see startIsolated).
	isoMu          sync.Mutex
	noPIDNamespace bool
}

// New validates cfg, restores the pods of a previous run from cfg.Dir and
// starts following the processes that still run.
func New(cfg Config) (*Backend, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("process backend: Dir %q must be an absolute directory", cfg.Dir)
	}
	if cfg.BackoffInitial <= 0 {
		cfg.BackoffInitial = DefaultBackoffInitial
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Shell == "" {
		cfg.Shell = DefaultShell
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.ContainerLogMaxSize <= 0 {
		cfg.ContainerLogMaxSize = DefaultContainerLogMaxSize
	}
	switch {
	case cfg.ContainerLogMaxFiles == 0:
		cfg.ContainerLogMaxFiles = DefaultContainerLogMaxFiles
	case cfg.ContainerLogMaxFiles < 2:
		return nil, fmt.Errorf("process backend: container log max files %d: keep at least 2 (the current file and one rotated)", cfg.ContainerLogMaxFiles)
	}
	if cfg.Notify == nil {
		cfg.Notify = func(*corev1.Pod) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{cfg: cfg, log: log, ctx: ctx, cancel: cancel}
	if err := b.restore(); err != nil {
		cancel()
		return nil, err
	}
	return b, nil
}

// Close stops following pods; their processes keep running and are
// adopted by the next Backend on the same Dir.
func (b *Backend) Close() error {
	b.cancel()
	b.pods.Wait()
	return nil
}

// CreatePod implements backend.Backend.
func (b *Backend) CreatePod(_ context.Context, pod *corev1.Pod) error {
	return b.pods.Create(b.ctx, pod.UID, func() *podRun { return newPodRun(b, pod.DeepCopy()) }, func(pr *podRun) error {
		if err := os.MkdirAll(pr.dir, 0o750); err != nil {
			return fmt.Errorf("pod directory: %w", err)
		}
		return nil
	})
}

// DeletePod implements backend.Backend.
func (b *Backend) DeletePod(_ context.Context, pod *corev1.Pod) error {
	b.pods.Delete(pod)
	return nil
}

// Forget implements backend.Backend: it kills what still runs and removes
// the pod's directory, logs included.
func (b *Backend) Forget(_ context.Context, pod *corev1.Pod) error {
	pr, found, err := b.pods.Forget(b.ctx, pod.UID)
	if !found || err != nil {
		return nil // err: the backend closes; what runs is the next run's
	}
	if err := os.RemoveAll(pr.dir); err != nil {
		return fmt.Errorf("removing pod directory: %w", err)
	}
	return nil
}

// Pods implements backend.Backend.
func (b *Backend) Pods() []*corev1.Pod { return b.pods.Pods() }

// byName returns the run of a pod, nil if none; the newest wins when a
// deleted pod's directory lingers.
func (b *Backend) byName(namespace, name string) *podRun {
	pr, _ := b.pods.ByName(namespace, name)
	return pr
}

// state is what is persisted per pod.
type state struct {
	Pod   *corev1.Pod          `json:"pod"`
	Procs map[string]procState `json:"procs,omitempty"`
}

type procState struct {
	PID          int    `json:"pid"`
	StartTicks   uint64 `json:"startTicks"`
	RestartCount int32  `json:"restartCount"`
}

func (b *Backend) restore() error {
	entries, err := os.ReadDir(b.cfg.Dir)
	if err != nil {
		return fmt.Errorf("process backend: reading %s: %w", b.cfg.Dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(b.cfg.Dir, e.Name(), "state.json")
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var st state
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err != nil || st.Pod == nil || string(st.Pod.UID) != e.Name() {
			b.log.Warn("Ignoring unreadable pod state", "path", path, "err", err)
			continue
		}
		pr := newPodRun(b, st.Pod)
		pr.restore(st.Procs)
		b.pods.Add(st.Pod.UID, func() *podRun { return pr })
		b.log.Info("Adopting pod from a previous run", "namespace", st.Pod.Namespace, "name", st.Pod.Name, "uid", st.Pod.UID, "phase", st.Pod.Status.Phase)
		b.pods.Go(b.ctx, pr)
	}
	return nil
}
