package cli

import (
	"context"

	"github.com/dpkit/dpkit/internal/pluginrun"
)

// Cluster is what commands read from an API server named by a kubeconfig.
// The dpkit binary has none (Env.Cluster is nil): it hands the command
// lines that need one to dpkit-cluster, so that it builds without the
// Kubernetes client libraries (docs/architecture.md, "Two binaries").
// Nothing here names a Kubernetes API type: the lean plugin image links
// this package, and k8s.io/api/core/v1 alone would add 5 MB to it.
type Cluster interface {
	// PodHealth returns a function that reads pods' device health
	// through the API server of kubeconfig.
	PodHealth(kubeconfig string) (PodHealthGetter, error)
	// DRA reads ResourceClaims and ResourceSlices through the API server
	// of kubeconfig.
	DRA(kubeconfig string) (DRAReader, error)
	// DRAFront starts the DRA front of a plugin's resource (dpkit plugin
	// with fronts: [dra]).
	DRAFront() pluginrun.DRAFront
}

// DeviceHealth is the device health a pod's status reports (its
// containers' and init containers' allocatedResourcesStatus): container
// name -> resource name -> device ID -> health (Healthy, Unhealthy,
// Unknown).
type DeviceHealth map[string]map[string]map[string]string

// PodHealthGetter reads one pod's device health; it is nil, with no
// error, when the API server has no pod of that name.
type PodHealthGetter func(ctx context.Context, namespace, name string) (DeviceHealth, error)

// NodePodsReader is a Cluster that reads the pods of one node, for dpkit
// exporter; dpkit-cluster's is one (an informer on the node's pods).
type NodePodsReader interface {
	// NodePods returns a function that reads the pods the API server
	// has bound to node, through the API server of kubeconfig ("" for
	// $KUBECONFIG, ~/.kube/config, then the pod's service account). They
	// are watched from the first call until ctx ends.
	NodePods(ctx context.Context, kubeconfig, node string) (NodePodsGetter, error)
}

// NodePod is what the API server says about one pod: its labels and its
// device health (DeviceHealth).
type NodePod struct {
	Labels map[string]string
	Health DeviceHealth
}

// NodePodsGetter reads a node's pods, by namespace and name.
type NodePodsGetter func(ctx context.Context) (map[[2]string]NodePod, error)
