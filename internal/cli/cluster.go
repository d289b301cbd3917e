package cli

import (
	"context"

	corev1 "k8s.io/api/core/v1"
)

// Cluster is what commands read from an API server named by a kubeconfig.
// The dpkit binary has none (Env.Cluster is nil): it hands the command
// lines that need one to dpkit-cluster, so that it builds without the
// Kubernetes client libraries (docs/architecture.md, "Two binaries").
type Cluster interface {
	// PodGetter returns a function that reads a pod through the API
	// server of kubeconfig; the pod is nil, with no error, when the API
	// server has none of that name.
	PodGetter(kubeconfig string) (PodGetter, error)
}

// PodGetter reads one pod.
type PodGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
