package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/claimalloc"
	"github.com/dpkit/dpkit/internal/cli"
	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
)

func (kubeClients) DRA(kubeconfig string) (cli.DRAReader, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return DRA(client), nil
}

// DRA reads ResourceClaims and ResourceSlices through client.
func DRA(client kubernetes.Interface) cli.DRAReader { return draReader{client} }

type draReader struct{ client kubernetes.Interface }

func (r draReader) Allocate(ctx context.Context, node string, pod []byte) error {
	p := &corev1.Pod{}
	if err := json.Unmarshal(pod, p); err != nil {
		return fmt.Errorf("decoding the pod: %w", err)
	}
	return claimalloc.Allocate(ctx, r.client, node, p)
}

func (r draReader) Release(ctx context.Context, pod []byte) error {
	p := &corev1.Pod{}
	if err := json.Unmarshal(pod, p); err != nil {
		return fmt.Errorf("decoding the pod: %w", err)
	}
	return claimalloc.Release(ctx, r.client, p)
}

func (r draReader) Claims(ctx context.Context, namespace string) ([]cli.Claim, error) {
	list, err := r.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	out := make([]cli.Claim, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, claimRow(&list.Items[i]))
	}
	return out, nil
}

func (r draReader) Slices(ctx context.Context) ([]cli.Slice, error) {
	list, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	out := make([]cli.Slice, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, sliceRow(&list.Items[i]))
	}
	return out, nil
}

func (r draReader) ClaimJSON(ctx context.Context, namespace, name string) ([]byte, error) {
	claim, err := r.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return json.Marshal(claim)
}

// claimRow is what dpkit get claims shows of c.
func claimRow(c *resourcev1.ResourceClaim) cli.Claim {
	row := cli.Claim{Namespace: c.Namespace, Name: c.Name, State: cli.ClaimPending}
	if a := c.Status.Allocation; a != nil {
		row.State = cli.ClaimAllocated
		row.Node = selectedNode(a.NodeSelector)
		for _, res := range a.Devices.Results {
			d := cli.ClaimDevice{Request: res.Request, Driver: res.Driver, Pool: res.Pool, Device: res.Device}
			if res.ShareID != nil {
				d.ShareID = string(*res.ShareID)
			}
			for name, q := range res.ConsumedCapacity {
				if d.Consumed == nil {
					d.Consumed = map[string]string{}
				}
				d.Consumed[string(name)] = q.String()
			}
			row.Devices = append(row.Devices, d)
		}
	}
	for _, ref := range c.Status.ReservedFor {
		row.ReservedFor = append(row.ReservedFor, ref.Name)
	}
	if row.State == cli.ClaimAllocated && len(row.ReservedFor) > 0 {
		row.State = cli.ClaimReserved
	}
	return row
}

// selectedNode returns the one node sel selects by name, as the
// scheduler's allocator writes it (a single term matching the field
// metadata.name), or "".
func selectedNode(sel *corev1.NodeSelector) string {
	if sel == nil || len(sel.NodeSelectorTerms) != 1 {
		return ""
	}
	t := sel.NodeSelectorTerms[0]
	if len(t.MatchExpressions) != 0 || len(t.MatchFields) != 1 {
		return ""
	}
	f := t.MatchFields[0]
	if f.Key != "metadata.name" || f.Operator != corev1.NodeSelectorOpIn || len(f.Values) != 1 {
		return ""
	}
	return f.Values[0]
}

// sliceRow is what dpkit get slices shows of s.
func sliceRow(s *resourcev1.ResourceSlice) cli.Slice {
	row := cli.Slice{Name: s.Name, Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Generation: s.Spec.Pool.Generation, Devices: []string{}}
	switch {
	case s.Spec.NodeName != nil:
		row.Node = *s.Spec.NodeName
	case s.Spec.AllNodes != nil && *s.Spec.AllNodes:
		row.Node = "*"
	}
	for _, d := range s.Spec.Devices {
		row.Devices = append(row.Devices, d.Name)
	}
	return row
}
