package cluster

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dpkit/dpkit/internal/cli"
	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
)

var _ cli.NodePodsReader = kubeClients{}

// NodePods watches the pods bound to node through the API server of
// kubeconfig.
func (kubeClients) NodePods(ctx context.Context, kubeconfig, node string) (cli.NodePodsGetter, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return NodePods(ctx, client, node), nil
}

// NodePods returns a getter of the pods bound to node, from an informer
// started on the first call and stopped when ctx ends: one watch for the
// node, however often the exporter reads. A call before the informer has
// synced waits for it, as long as its own ctx allows.
func NodePods(ctx context.Context, client kubernetes.Interface, node string) cli.NodePodsGetter {
	var (
		once   sync.Once
		lister func() ([]*corev1.Pod, error)
		synced cache.InformerSynced
	)
	start := func() {
		f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
		inf := f.Core().V1().Pods()
		synced = inf.Informer().HasSynced
		lister = func() ([]*corev1.Pod, error) { return inf.Lister().List(labels.Everything()) }
		f.Start(ctx.Done())
	}
	return func(cctx context.Context) (map[[2]string]cli.NodePod, error) {
		once.Do(start)
		if !synced() && !cache.WaitForCacheSync(cctx.Done(), synced) {
			return nil, fmt.Errorf("the pods of node %s: not listed yet from the API server", node)
		}
		pods, err := lister()
		if err != nil {
			return nil, err
		}
		out := make(map[[2]string]cli.NodePod, len(pods))
		for _, p := range pods {
			out[[2]string{p.Namespace, p.Name}] = cli.NodePod{Labels: p.Labels, Health: deviceHealth(p)}
		}
		return out, nil
	}
}
