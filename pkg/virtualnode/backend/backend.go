// Package backend defines what runs a virtual node's pods. A Backend owns
// the status of the pods it runs and reports every change through
// Config.Notify; the virtual node handles admission, devices and the API.
//
// Optional capabilities are found by type assertion: LogReader, Executor,
// Attacher, PortForwarder and StatsProvider.
package backend

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Config is what every backend is given.
type Config struct {
	// Notify receives a copy of a pod whenever its status changes. It may
	// block; backends call it without holding their locks.
	Notify func(*corev1.Pod)
	// ContainerEnv returns the environment the node gives a container
	// beyond the literal values of its spec: the values it resolved from
	// Secrets, ConfigMaps, the downward API and Services, then the device
	// plugins' variables; a later entry wins over an earlier one of the
	// same name. Pods reach the backend as the API server has them (env
	// and envFrom name their sources, resolved values are left out), so
	// that no Secret's value is kept where pods are stored or served; the
	// backend asks for the values each time it starts a container and
	// keeps them in memory only. It may block (after a restart, until the
	// node has read the pod from the API server again) and returns ctx's
	// error when ctx ends first. May be nil.
	ContainerEnv func(ctx context.Context, pod *corev1.Pod, container string) ([]corev1.EnvVar, error)
	// ContainerDevices returns what the device plugins' Allocate answers
	// and the container's ResourceClaims give a container beyond
	// environment variables: device nodes, mounts, annotations and CDI
	// device names. Backends that run containers apply them; the others
	// ignore them. It returns nil when the container holds no devices.
	// May be nil.
	ContainerDevices func(ctx context.Context, pod *corev1.Pod, container string) (*ContainerDevices, error)
	// PreStart is called before each start of a container (the device
	// plugins' PreStartContainer). May be nil.
	PreStart func(ctx context.Context, pod *corev1.Pod, container string) error
	// Event records an event about a pod, or about one of its containers
	// when container is not empty (the kubelet's container events:
	// Unhealthy, Killing, FailedPostStartHook...). It must not block. May
	// be nil.
	Event func(pod *corev1.Pod, container, eventType, reason, message string)
	// Volumes reads the API objects that a pod's configMap, secret and
	// projected volumes show, and issues their service account tokens.
	// Backends that run containers materialize volumes from it; without
	// one (nil) such volumes fail to mount.
	Volumes VolumeSource
	// NodeAllocatable returns the node's allocatable resources, which a
	// downward API resourceFieldRef to an unset limit reads (the
	// kubelet's MergeContainerResourceLimits). May be nil.
	NodeAllocatable func() corev1.ResourceList
	// NodeIP is reported as the pods' hostIP and podIP.
	NodeIP string
	// Logger receives the backend's logs; nil discards them.
	Logger *slog.Logger
}

// VolumeSource reads what a pod's volumes show, authorized as the node.
// Errors about objects that do not exist satisfy apierrors.IsNotFound and
// read as the kubelet's ("configmap \"x\" not found").
type VolumeSource interface {
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// ServiceAccountToken asks the TokenRequest API for a token of the
	// service account, bound to the pod the request names.
	ServiceAccountToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// ContainerDevices are a container's devices as a container runtime
// applies them.
type ContainerDevices struct {
	// Devices are device nodes to create in the container.
	Devices []DeviceSpec
	// Mounts are bind mounts into the container.
	Mounts []Mount
	// Annotations go to the container runtime with the container.
	Annotations map[string]string
	// CDIDevices are fully-qualified CDI device names: those of the
	// device plugins' Allocate answers, then those of the container's
	// ResourceClaims.
	CDIDevices []string
}

// DeviceSpec is a device node: the host's HostPath shown at
// ContainerPath with Permissions (cgroup permissions, "rwm").
type DeviceSpec struct {
	ContainerPath, HostPath, Permissions string
}

// Mount is a bind mount of HostPath at ContainerPath.
type Mount struct {
	ContainerPath, HostPath string
	ReadOnly                bool
}

// Backend runs pods.
type Backend interface {
	// CreatePod starts running an admitted pod. It returns once the pod is
	// accepted; progress is reported through Config.Notify.
	CreatePod(ctx context.Context, pod *corev1.Pod) error
	// DeletePod stops the pod's containers, honouring its termination
	// grace period, and reports their terminal statuses. It may be called
	// more than once.
	DeletePod(ctx context.Context, pod *corev1.Pod) error
	// Forget drops every trace of a pod deleted from the API server.
	Forget(ctx context.Context, pod *corev1.Pod) error
	// Pods returns every pod the backend knows, with its current status.
	// After a restart these are the pods adopted from the previous run.
	Pods() []*corev1.Pod
	// Close stops the backend's own goroutines; what it runs keeps
	// running where the backend supports it (process).
	Close() error
}

// LogOptions select what a LogReader returns, like the kubelet's
// container log options.
type LogOptions struct {
	Tail       int // lines from the end; negative means all
	LimitBytes int
	Timestamps bool
	Follow     bool
	Previous   bool
	SinceTime  time.Time
}

// LogReader is implemented by backends that keep container logs.
type LogReader interface {
	Logs(ctx context.Context, namespace, pod, container string, opts LogOptions) (io.ReadCloser, error)
}

// ExecIO are the streams of an exec session.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	TTY            bool
}

// Executor is implemented by backends that can run a command in a
// container's environment.
type Executor interface {
	Exec(ctx context.Context, namespace, pod, container string, cmd []string, io ExecIO) error
}

// Attacher is implemented by backends that can attach to a running
// container's output, as `kubectl attach` does: Attach writes what the
// container prints from now on to io.Stdout and io.Stderr (or both to
// io.Stdout with TTY) until the container stops or ctx ends.
type Attacher interface {
	Attach(ctx context.Context, namespace, pod, container string, io ExecIO) error
}

// PortForwarder is implemented by backends whose pods can be reached on a
// port, as `kubectl port-forward` does: PortForward connects stream to the
// pod's port and copies both ways until either side ends.
type PortForwarder interface {
	PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error
}

// StatsProvider is implemented by backends that can measure their pods.
type StatsProvider interface {
	PodStats(ctx context.Context) ([]statsv1alpha1.PodStats, error)
}

// OrphanCleaner is implemented by backends that keep files or mounts per
// pod on the node. CleanupOrphans removes those of pods the backend does
// not run and known does not report (the API server's pods of the node),
// as the kubelet's housekeeping removes orphaned pod directories and
// their volumes.
type OrphanCleaner interface {
	CleanupOrphans(ctx context.Context, known func(types.UID) bool) error
}

// SortPods orders pods by "namespace/name", the order every backend's
// Pods returns.
func SortPods(pods []*corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
}
