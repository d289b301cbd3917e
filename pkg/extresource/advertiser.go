package extresource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Advertiser writes extended resources into nodes' status.
type Advertiser struct {
	client      kubernetes.Interface
	logger      *slog.Logger
	allocatable bool
}

// AdvertiserConfig configures NewAdvertiser.
type AdvertiserConfig struct {
	// Client talks to the apiserver. It needs get on nodes and patch on
	// nodes/status.
	Client kubernetes.Interface
	// SkipAllocatable leaves status.allocatable alone. By default the
	// advertiser writes allocatable along with capacity, as the kubelet
	// would on its next status update, so the scheduler can use the
	// resource at once and nodes without a kubelet (virtual nodes) work.
	SkipAllocatable bool
	// Logger receives one line per change. Nil discards.
	Logger *slog.Logger
}

// NewAdvertiser returns an Advertiser for cfg.
func NewAdvertiser(cfg AdvertiserConfig) (*Advertiser, error) {
	if cfg.Client == nil {
		return nil, errors.New("extresource: AdvertiserConfig.Client is nil")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Advertiser{client: cfg.Client, logger: logger, allocatable: !cfg.SkipAllocatable}, nil
}

// maxAttempts bounds retries when the node changes between the read and the
// patch (a removed member makes a "remove" operation fail).
const maxAttempts = 5

// Plan reads the node and returns the patch Apply would send, sending
// nothing.
func (a *Advertiser) Plan(ctx context.Context, nodeName string, set corev1.ResourceList, remove []corev1.ResourceName) (Patch, Change, error) {
	node, err := a.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, Change{}, fmt.Errorf("get node %s: %w", nodeName, err)
	}
	p, c := Diff(node, set, remove, a.allocatable)
	return p, c, nil
}

// Apply sets the resources in set on the node and removes those in remove.
// It is idempotent: when the node already matches it sends nothing and
// returns an empty Change.
func (a *Advertiser) Apply(ctx context.Context, nodeName string, set corev1.ResourceList, remove []corev1.ResourceName) (Change, error) {
	var lastErr error
	for range maxAttempts {
		patch, change, err := a.Plan(ctx, nodeName, set, remove)
		if err != nil {
			return Change{}, err
		}
		if len(patch) == 0 {
			return Change{}, nil
		}
		_, err = a.client.CoreV1().Nodes().Patch(ctx, nodeName, types.JSONPatchType, patch.JSON(), metav1.PatchOptions{}, "status")
		if err == nil {
			a.logger.Info("Updated node extended resources", "node", nodeName, "set", formatList(change.Set), "removed", change.Removed)
			return change, nil
		}
		lastErr = err
		// A member removed or a map emptied by another writer since the
		// read: read again and recompute.
		if apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
			a.logger.Debug("Node changed under the patch, retrying", "node", nodeName, "err", err)
			continue
		}
		break
	}
	return Change{}, fmt.Errorf("patch node %s status: %w", nodeName, lastErr)
}

func formatList(l corev1.ResourceList) []string {
	out := make([]string, 0, len(l))
	for _, n := range sortedNames(l) {
		q := l[n]
		out = append(out, string(n)+"="+q.String())
	}
	return out
}
