package podresources_test

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

type onePod struct{ pod *corev1.Pod }

func (p onePod) GetActivePods() []*corev1.Pod { return []*corev1.Pod{p.pod} }
func (p onePod) GetPodByName(ns, name string) (*corev1.Pod, bool) {
	return p.pod, p.pod.Namespace == ns && p.pod.Name == name
}

type gpus struct{}

func (gpus) GetDevices(podUID, container string) []*podresourcesv1.ContainerDevices {
	if podUID == "uid-1" && container == "main" {
		return []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0"}}}
	}
	return nil
}

func (gpus) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0", "gpu1"}}}
}

func Example() {
	root, _ := os.MkdirTemp("", "ex")
	defer os.RemoveAll(root)

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer", UID: "uid-1"}}
	pod.Spec.Containers = []corev1.Container{{Name: "main"}}
	srv, err := podresources.NewServer(podresources.Config{
		Providers: podresources.Providers{Pods: onePod{pod}, Devices: gpus{}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	socket := podresources.SocketPath(root) // <root>/pod-resources/kubelet.sock
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, socket) }()

	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	client, conn, err := prclient.Dial(dctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	list, err := client.List(dctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range list.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				fmt.Println(p.GetNamespace(), p.GetName(), c.GetName(), d.GetResourceName(), d.GetDeviceIds())
			}
		}
	}
	_, err = client.Get(dctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "other"})
	fmt.Println(err)

	_ = conn.Close()
	cancel()
	fmt.Println("serve:", <-done)
	// Output:
	// default trainer main example.com/gpu [gpu0]
	// rpc error: code = NotFound desc = pod other in namespace default not found
	// serve: <nil>
}
