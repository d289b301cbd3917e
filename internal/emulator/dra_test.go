package emulator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
)

// fileClaims serves the claim files of dir as an API server's JSON.
func fileClaims(dir dratest.Claims) ClaimJSONGetter {
	return func(_ context.Context, ns, name string) ([]byte, error) {
		return os.ReadFile(filepath.Join(string(dir), ns+"_"+name+".json"))
	}
}

// startDRAEmulator runs an emulator with claims read through
// ClaimsFromJSON from the fake driver's claim files, and the fake DRA
// driver registered with it.
func startDRAEmulator(t *testing.T) (*Emulator, dratest.Claims, *dratest.Driver) {
	t.Helper()
	root := testdir.Short(t, "kl")
	claims := dratest.Claims(filepath.Join(root, "claims"))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *Emulator, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Root: root, Claims: ClaimsFromJSON(fileClaims(claims))}, func(e *Emulator) { started <- e })
	}()
	var e *Emulator
	select {
	case e = <-started:
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	drv := dratest.Start(t, root, claims)
	for {
		ch := e.host.DRA.PluginsChanged()
		if ps := e.host.DRA.Plugins(); len(ps) == 1 && ps[0].Connected {
			break
		}
		<-ch
	}
	return e, claims, drv
}

const claimPodYAML = `metadata: {name: %s, uid: %s}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: %s}]
  containers:
  - name: main
    resources: {claims: [{name: gpu}]}
  - name: side
`

func claimPod(name, uid, claim string) []byte {
	return fmt.Appendf(nil, claimPodYAML, name, uid, claim)
}

// TestAdmitPreparesClaims: a pod whose claim is allocated and reserved for
// it is prepared through the DRA driver when admitted (one
// NodePrepareResources with the claim), its container shows the claim's
// devices and gets their CDI devices (the other container none), and
// deleting the pod unprepares the claim. A claim not reserved for the pod
// refuses it, naming the claim and saying who allocates, and leaves
// nothing behind.
func TestAdmitPreparesClaims(t *testing.T) {
	e, claims, drv := startDRAEmulator(t)
	c := NewClient(e.opts.AdminSocket)
	defer c.Close()
	ctx := context.Background()

	claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"pod-1"}, "dev-0", "dev-1")
	pod, err := c.AdmitPod(ctx, claimPod("train", "pod-1", "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	if m, uids := drv.NextCall(t); m != "NodePrepareResources" || !reflect.DeepEqual(uids, []string{"uid-gpu"}) {
		t.Fatalf("driver call %s %v, want NodePrepareResources [uid-gpu]", m, uids)
	}
	main, side := pod.Containers[0], pod.Containers[1]
	wantCDI := []string{dratest.CDIDeviceID("dev-0"), dratest.CDIDeviceID("dev-1")}
	if main.Options == nil || !reflect.DeepEqual(main.Options.CDIDevices, wantCDI) {
		t.Errorf("main's runtime options %+v, want CDI devices %v", main.Options, wantCDI)
	}
	wantClaims := []ClaimAllocation{{Claim: "gpu", Devices: []string{"fake.dpkit.io/pool/dev-0", "fake.dpkit.io/pool/dev-1"}}}
	if !reflect.DeepEqual(main.Claims, wantClaims) {
		t.Errorf("main's claims %+v, want %+v", main.Claims, wantClaims)
	}
	if side.Options != nil || side.Claims != nil {
		t.Errorf("side uses no claim, got %+v", side)
	}

	claims.Add(t, "default", "other", "uid-other", []types.UID{"someone-else"}, "dev-2")
	_, err = c.AdmitPod(ctx, claimPod("late", "pod-2", "other"))
	var ae *APIError
	if !errors.As(err, &ae) || ae.Reason != devicehost.FailedPrepareDynamicResources || !strings.Contains(ae.Message, "ResourceClaim other (uid-other): status.reservedFor does not list it") ||
		!strings.Contains(ae.Message, "this emulated kubelet does not allocate claims") || !strings.Contains(ae.Message, "uid: pod-2") {
		t.Errorf("admitting a pod whose claim is reserved for another: %v, want %s naming the claim and who allocates", err, devicehost.FailedPrepareDynamicResources)
	}
	if pods, err := c.Pods(ctx); err != nil || len(pods) != 1 {
		t.Errorf("pods after a refusal: %+v (%v), want the first only", pods, err)
	}

	if _, err := c.DeletePod(ctx, "default", "train"); err != nil {
		t.Fatal(err)
	}
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-gpu"}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [uid-gpu]", m, uids)
	}
	drv.NoMoreCalls(t)
}

// TestAdmitClaimsWithoutAPIServer: an emulator with no claim source
// refuses a pod with claims and says how to give it one.
func TestAdmitClaimsWithoutAPIServer(t *testing.T) {
	e, stop := startEmulator(t, testdir.Short(t, "kl"))
	defer stop()
	c := NewClient(e.opts.AdminSocket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.AdmitPod(ctx, claimPod("train", "pod-1", "gpu"))
	var ae *APIError
	if !errors.As(err, &ae) || ae.Reason != devicehost.FailedPrepareDynamicResources || !strings.Contains(ae.Message, "--kubeconfig") {
		t.Errorf("admitting a pod with a claim: %v, want %s asking for --kubeconfig", err, devicehost.FailedPrepareDynamicResources)
	}
}

// cdiDevices is twoDevices whose Allocate answers with a CDI device per
// device ID.
type cdiDevices struct{ twoDevices }

func (cdiDevices) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: "example.com/foo=" + id})
	}
	return resp, nil
}

// TestAdmitCDIOrder: a container with a claim and a device plugin's
// device gets the claim's CDI devices first, then the device plugin's, as
// the kubelet's containerManagerImpl.GetResources merges them.
func TestAdmitCDIOrder(t *testing.T) {
	e, claims, drv := startDRAEmulator(t)
	defer startPluginWith(t, e.opts.Root, cdiDevices{})()
	waitAllocatable(t, e, 2)
	c := NewClient(e.opts.AdminSocket)
	defer c.Close()
	claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"pod-both"}, "dev-0")
	pod, err := c.AdmitPod(context.Background(), []byte(`metadata: {name: both, uid: pod-both}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: gpu}]
  containers:
  - name: main
    resources:
      claims: [{name: gpu}]
      limits: {example.com/foo: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	main := pod.Containers[0]
	if main.Options == nil || len(main.Options.CDIDevices) != 2 {
		t.Fatalf("main's runtime options %+v, want two CDI devices", main.Options)
	}
	if got := main.Options.CDIDevices; got[0] != dratest.CDIDeviceID("dev-0") || !strings.HasPrefix(got[1], "example.com/foo=") {
		t.Errorf("CDI devices %v, want the claim's (%s) first, then the device plugin's", got, dratest.CDIDeviceID("dev-0"))
	}
}
