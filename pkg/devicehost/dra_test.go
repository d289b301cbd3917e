package devicehost_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// TestHostRunsDRADriver: a DRA driver registers through the host's plugin
// watcher, the host's DRA manager prepares a pod's claim, and the
// PodResources API on the host's socket reports it in dynamic_resources.
func TestHostRunsDRADriver(t *testing.T) {
	h := startDRAHost(t)
	host, claims, d := h.host, h.claims, h.drv
	ctx := t.Context()
	claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"pod-1"}, "dev-1")
	pod := dratest.Pod("default", "p", "pod-1", "gpu")
	if err := host.DRA.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
	host.Pods.Add(pod)

	client, closer, err := prclient.Dial(ctx, host.PodResourcesSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	resp, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: "p", PodNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dyn := resp.GetPodResources().GetContainers()[0].GetDynamicResources()
	if len(dyn) != 1 || dyn[0].GetClaimName() != "gpu" || len(dyn[0].GetClaimResources()) != 1 {
		t.Fatalf("dynamic_resources = %v, want claim gpu with one device", dyn)
	}
	r := dyn[0].GetClaimResources()[0]
	if r.GetDriverName() != dratest.DriverName || r.GetDeviceName() != "dev-1" || len(r.GetCdiDevices()) != 1 || r.GetCdiDevices()[0].GetName() != dratest.CDIDeviceID("dev-1") {
		t.Fatalf("claim resource = %v", r)
	}
}
