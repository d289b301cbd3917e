package draplugin_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/draplugin"
)

// sharedGPU describes dev-0 as an 80Gi GPU shared in memory shares.
type sharedGPU struct{ *plugin }

func (sharedGPU) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	return deviceplugin.DeviceInfo{
		Capacity: map[string]string{"memory": "80Gi", "cores": "132"},
		Sharing: &deviceplugin.Sharing{Shared: map[string]deviceplugin.SharedCapacity{
			"memory": {Total: 80 << 30, Default: 80 << 30, Min: 1 << 30, Step: 1 << 30},
		}},
	}, id == "dev-0"
}

// TestPrepareShares: two claims with a 20Gi share each of one shared
// device are both prepared; each answer carries its shareID, and each
// share's CDI device tells the container its share. After a restart the
// shares are held again, and a third share that no longer fits is refused
// naming the holders.
func TestPrepareShares(t *testing.T) {
	n := newNode(t)
	p := newPlugin()
	d := n.startServing(t, p, sharedGPU{p}, healthy("dev-0"), "")
	share := func(name, shareID, memory string) {
		c := n.add(t, "default", name, types.UID("uid-"+name), []types.UID{types.UID("pod-" + name)}, "dev-0")
		r := &c.Status.Allocation.Devices.Results[0]
		r.ShareID = ptr(types.UID(shareID))
		r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{
			driverName + "/memory": resource.MustParse(memory),
		}
		n.put(t, c)
	}
	share("a", "11111111-1111-1111-1111-111111111111", "20Gi")
	share("b", "22222222-2222-2222-2222-222222222222", "20Gi")
	ctx := context.Background()
	client := drav1.NewDRAPluginClient(dial(t, d.drv.Endpoint()))
	resp, err := client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{
		{Namespace: "default", Name: "a", Uid: "uid-a"}, {Namespace: "default", Name: "b", Uid: "uid-b"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": "11111111-1111-1111-1111-111111111111", "b": "22222222-2222-2222-2222-222222222222"} {
		r := resp.Claims["uid-"+name]
		if r.GetError() != "" || len(r.GetDevices()) != 1 {
			t.Fatalf("claim %s: %v, want one device prepared", name, r)
		}
		dev := r.GetDevices()[0]
		if dev.GetShareId() != want {
			t.Errorf("claim %s: shareID %q, want %q", name, dev.GetShareId(), want)
		}
		shareCDI := draplugin.CDIKind(driverName) + "=" + draplugin.CDIDeviceName("uid-"+name, "req") + "-" + want
		if !slices.Contains(dev.GetCdiDeviceIds(), shareCDI) {
			t.Errorf("claim %s: CDI devices %v, want the share's %s", name, dev.GetCdiDeviceIds(), shareCDI)
		}
		env := shareEnv(t, n.specPath("uid-"+name), want)
		if !slices.Contains(env, draplugin.EnvShareID+"="+want) || !slices.Contains(env, "DPKIT_SHARE_MEMORY=20Gi") || !slices.Contains(env, draplugin.EnvShareDevice+"=dev-0") {
			t.Errorf("claim %s: share environment %v, want its ID, device and DPKIT_SHARE_MEMORY=20Gi", name, env)
		}
		if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "DPKIT_SHARE_CORES=") }) {
			t.Errorf("claim %s: %v names cores, which the device does not share", name, env)
		}
	}
	if got := d.inv.Holders("dev-0"); len(got) != 2 {
		t.Fatalf("dev-0 holders %v, want both claims", got)
	}

	// After a restart both shares are held again.
	d.stop()
	p2 := newPlugin()
	d2 := n.startServing(t, p2, sharedGPU{p2}, healthy("dev-0"), "")
	if got := d2.inv.Holders("dev-0"); len(got) != 2 {
		t.Fatalf("dev-0 holders after a restart %v, want both claims", got)
	}
	share("c", "33333333-3333-3333-3333-333333333333", "50Gi")
	client = drav1.NewDRAPluginClient(dial(t, d2.drv.Endpoint()))
	resp, err = client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "c", Uid: "uid-c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if msg := resp.Claims["uid-c"].GetError(); !strings.Contains(msg, "memory 50Gi asked, 40Gi of 80Gi left") || !strings.Contains(msg, "default/a") || !strings.Contains(msg, "default/b") {
		t.Fatalf("a share beyond the device: %q, want a refusal naming what is left and both holders", msg)
	}
}

// shareEnv returns the environment of a share's CDI device in a claim's
// spec file.
func shareEnv(t *testing.T, path, shareID string) []string {
	t.Helper()
	blob, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(blob, &spec); err != nil {
		t.Fatal(err)
	}
	for _, d := range spec.Devices {
		if strings.HasSuffix(d.Name, "-"+shareID) {
			return d.ContainerEdits.Env
		}
	}
	t.Fatalf("no CDI device of share %s in %s", shareID, path)
	return nil
}
