// Package podresources serves the kubelet's PodResources API v1
// (k8s.io/kubelet/pkg/apis/podresources/v1) from data that small provider
// interfaces supply: the pods of the node, the devices assigned to their
// containers and the devices the node can allocate. The device manager
// and the virtual node implement the providers; monitoring agents that
// read the kubelet's pod-resources socket read this server unchanged.
package podresources

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/podspec"
)

// PodsProvider lists the pods the node runs.
type PodsProvider interface {
	// GetActivePods returns the pods that are admitted and not terminated.
	GetActivePods() []*corev1.Pod
	// GetPodByName returns the pod with that namespace and name.
	GetPodByName(namespace, name string) (*corev1.Pod, bool)
}

// DevicesProvider reports device plugin devices.
type DevicesProvider interface {
	// GetDevices returns the devices assigned to a container, one entry
	// per resource (and NUMA placement), with their topology.
	GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices
	// GetAllocatableDevices returns every device the node can allocate,
	// healthy or not, whether allocated or free.
	GetAllocatableDevices() []*podresourcesv1.ContainerDevices
}

// CPUsProvider reports exclusively assigned CPUs.
type CPUsProvider interface {
	GetCPUs(podUID, containerName string) []int64
	GetAllocatableCPUs() []int64
}

// MemoryProvider reports memory assigned by a memory manager.
type MemoryProvider interface {
	GetMemory(podUID, containerName string) []*podresourcesv1.ContainerMemory
	GetAllocatableMemory() []*podresourcesv1.ContainerMemory
}

// DynamicResourcesProvider reports resources from dynamic resource
// allocation claims.
type DynamicResourcesProvider interface {
	GetDynamicResources(pod *corev1.Pod, container *corev1.Container) []*podresourcesv1.DynamicResource
}

// Providers supply the data the server answers with. Pods is required;
// a nil provider of any other kind reports nothing.
type Providers struct {
	Pods             PodsProvider
	Devices          DevicesProvider
	CPUs             CPUsProvider
	Memory           MemoryProvider
	DynamicResources DynamicResourcesProvider
}

// Config configures a Server.
type Config struct {
	Providers
	// Logger receives request logs at debug level. Nil discards them.
	Logger *slog.Logger
	// QPS and Burst configure the token bucket that limits requests when
	// the server is served with Serve or GRPCServer. Zero means the
	// kubelet's defaults (DefaultQPS, DefaultBurstTokens); a negative QPS
	// turns rate limiting off.
	QPS   float64
	Burst int
	// Registerer, when set, receives the kubelet's PodResources request
	// counters (kubelet_pod_resources_endpoint_*).
	Registerer prometheus.Registerer
}

// Validate reports every problem in c, each with its field path.
func (c *Config) Validate() error {
	var errs field.ErrorList
	if c.Pods == nil {
		errs = append(errs, field.Required(field.NewPath("providers", "pods"), "set a PodsProvider: the server cannot answer without the node's pods"))
	}
	if c.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("burst"), c.Burst, "must not be negative; leave it zero for the default"))
	}
	return errs.ToAggregate()
}

// Server implements podresourcesv1.PodResourcesListerServer.
type Server struct {
	podresourcesv1.UnimplementedPodResourcesListerServer

	p       Providers
	log     *slog.Logger
	qps     float64
	burst   int
	metrics *metrics
}

var _ podresourcesv1.PodResourcesListerServer = (*Server)(nil)

// NewServer validates cfg, applies defaults and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("podresources: invalid config: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{p: cfg.Providers, log: cfg.Logger, qps: cfg.QPS, burst: cfg.Burst, metrics: m}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.qps == 0 {
		s.qps = DefaultQPS
	}
	if s.burst == 0 {
		s.burst = DefaultBurstTokens
	}
	if s.p.Devices == nil {
		s.p.Devices = noDevices{}
	}
	if s.p.CPUs == nil {
		s.p.CPUs = noCPUs{}
	}
	if s.p.Memory == nil {
		s.p.Memory = noMemory{}
	}
	return s, nil
}

// List returns the resources assigned to every active pod of the node.
func (s *Server) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.metrics.requestsTotal.Inc()
	s.metrics.requestsList.Inc()
	pods := s.p.Pods.GetActivePods()
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: make([]*podresourcesv1.PodResources, 0, len(pods))}
	for _, pod := range pods {
		resp.PodResources = append(resp.PodResources, s.podResources(pod))
	}
	s.log.DebugContext(ctx, "Podresources List", "pods", len(pods))
	return resp, nil
}

// Get returns the resources assigned to one pod. An unknown pod is a
// NotFound error.
func (s *Server) Get(ctx context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	s.metrics.requestsTotal.Inc()
	s.metrics.requestsGet.Inc()
	pod, ok := s.p.Pods.GetPodByName(req.GetPodNamespace(), req.GetPodName())
	if !ok || pod == nil {
		s.metrics.errorsGet.Inc()
		s.log.DebugContext(ctx, "Podresources Get: pod not found", "namespace", req.GetPodNamespace(), "name", req.GetPodName())
		return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
	}
	s.log.DebugContext(ctx, "Podresources Get", "namespace", pod.Namespace, "name", pod.Name)
	return &podresourcesv1.GetPodResourcesResponse{PodResources: s.podResources(pod)}, nil
}

// GetAllocatableResources returns everything the node can allocate: its
// capacity, not what is free.
func (s *Server) GetAllocatableResources(ctx context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	s.metrics.requestsTotal.Inc()
	s.metrics.requestsGetAllocatable.Inc()
	s.log.DebugContext(ctx, "Podresources GetAllocatableResources")
	return &podresourcesv1.AllocatableResourcesResponse{
		Devices: s.p.Devices.GetAllocatableDevices(),
		CpuIds:  s.p.CPUs.GetAllocatableCPUs(),
		Memory:  s.p.Memory.GetAllocatableMemory(),
	}, nil
}

// podResources reports a pod's sidecars (restartable init containers)
// and regular containers, in that order, as the kubelet does; other init
// containers have finished and hold nothing.
func (s *Server) podResources(pod *corev1.Pod) *podresourcesv1.PodResources {
	pr := &podresourcesv1.PodResources{
		Name:       pod.Name,
		Namespace:  pod.Namespace,
		Containers: make([]*podresourcesv1.ContainerResources, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers)),
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if !podspec.IsSidecar(c) {
			continue
		}
		pr.Containers = append(pr.Containers, s.containerResources(pod, c))
	}
	for i := range pod.Spec.Containers {
		pr.Containers = append(pr.Containers, s.containerResources(pod, &pod.Spec.Containers[i]))
	}
	return pr
}

func (s *Server) containerResources(pod *corev1.Pod, c *corev1.Container) *podresourcesv1.ContainerResources {
	uid := string(pod.UID)
	cr := &podresourcesv1.ContainerResources{
		Name:    c.Name,
		Devices: s.p.Devices.GetDevices(uid, c.Name),
		CpuIds:  s.p.CPUs.GetCPUs(uid, c.Name),
		Memory:  s.p.Memory.GetMemory(uid, c.Name),
	}
	if s.p.DynamicResources != nil {
		cr.DynamicResources = s.p.DynamicResources.GetDynamicResources(pod, c)
	}
	return cr
}

type noDevices struct{}

func (noDevices) GetDevices(string, string) []*podresourcesv1.ContainerDevices { return nil }
func (noDevices) GetAllocatableDevices() []*podresourcesv1.ContainerDevices    { return nil }

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesv1.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesv1.ContainerMemory    { return nil }
