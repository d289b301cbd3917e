package virtualnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/process"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// recordingPlugin is a device plugin on the raw API that records every
// PreStartContainer call it gets, whatever it told the kubelet in its
// options, so that a test sees calls a plugin did not ask for.
type recordingPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	opts    *pluginapi.DevicePluginOptions
	devices []*pluginapi.Device
	// onPreStart runs inside each PreStartContainer call, before it is
	// recorded.
	onPreStart func(call int, ids []string)

	mu    sync.Mutex
	calls [][]string
}

func (p *recordingPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.opts, nil
}

func (p *recordingPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *recordingPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func (p *recordingPlugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.mu.Lock()
	call := len(p.calls)
	p.mu.Unlock()
	if p.onPreStart != nil {
		p.onPreStart(call, req.DevicesIds)
	}
	p.mu.Lock()
	p.calls = append(p.calls, slices.Sorted(slices.Values(req.DevicesIds)))
	p.mu.Unlock()
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *recordingPlugin) Calls() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// serveRecording serves p for resource on a socket in the node's plugin
// directory and registers it, until the test ends or stop is called.
func serveRecording(t *testing.T, m *devicemanager.Manager, resource, sock string, p *recordingPlugin) (stop func()) {
	t.Helper()
	path := filepath.Join(filepath.Dir(m.SocketPath()), sock)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(stop)
	conn, err := grpc.NewClient("unix://"+m.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: sock, ResourceName: resource, Options: p.opts,
	}); err != nil {
		t.Fatalf("Register %s: %v", resource, err)
	}
	return stop
}

func healthyDevices(ids ...string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	}
	return out
}

// preStartBackend builds a backend for the PreStart tests and tells
// whether it has begun starting a container: for the sim backend, the
// container's reported state; for the process backend, whether it asked
// for the container's environment, which it does right before it starts
// the process.
type preStartBackend struct {
	name    string
	new     func(t *testing.T, root string, cfg backend.Config) backend.Backend
	started func(n *preStartNode, container string) bool
}

var preStartBackends = []preStartBackend{
	{
		name: "sim",
		new: func(_ *testing.T, _ string, cfg backend.Config) backend.Backend {
			return sim.New(sim.Config{Config: cfg})
		},
		started: func(n *preStartNode, container string) bool {
			for _, p := range n.p.be.Pods() {
				for _, s := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
					if s.Name == container {
						return s.State.Waiting == nil
					}
				}
			}
			return false
		},
	},
	{
		name: "process",
		new: func(t *testing.T, root string, cfg backend.Config) backend.Backend {
			be, err := process.New(process.Config{Config: cfg, Dir: filepath.Join(root, "pods")})
			if err != nil {
				t.Fatal(err)
			}
			return be
		},
		started: func(n *preStartNode, container string) bool {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.envAsked[container]
		},
	},
}

// holdingCommand is a process-backend command that, unless exit, runs
// until root/hold is removed.
func holdingCommand(root string, exit bool) []string {
	if exit {
		return []string{"true"}
	}
	return []string{"sh", "-c", fmt.Sprintf("while [ -e %s ]; do sleep 0.05; done", filepath.Join(root, "hold"))}
}

// preStartNode is a provider over a backend, with a hold file that keeps
// the process backend's containers running until the test ends.
type preStartNode struct {
	ctx  context.Context
	root string
	mgr  *devicemanager.Manager
	p    *provider
	got  *statuses

	mu       sync.Mutex
	envAsked map[string]bool // containers whose environment the backend asked for
}

func startPreStartNode(t *testing.T, b preStartBackend) *preStartNode {
	t.Helper()
	root := testdir.Short(t, "vnp")
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, host, p := startProvider(t, root)
	n := &preStartNode{ctx: ctx, root: root, mgr: host.Manager, p: p, got: recordStatuses(ctx, p), envAsked: map[string]bool{}}
	env := func(ctx context.Context, pod *corev1.Pod, container string) ([]corev1.EnvVar, error) {
		n.mu.Lock()
		n.envAsked[container] = true
		n.mu.Unlock()
		return p.containerEnv(ctx, pod, container)
	}
	p.be = b.new(t, root, backend.Config{Notify: p.backendNotify, PreStart: p.preStart, ContainerEnv: env})
	t.Cleanup(func() { _ = os.Remove(hold); _ = p.be.Close() })
	return n
}

// stopPod deletes the pod without a grace period and waits until it has
// terminated, so that no process outlives the test.
func stopPod(t *testing.T, ctx context.Context, p *provider, got *statuses, pod *corev1.Pod) {
	t.Helper()
	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	deleting.DeletionGracePeriodSeconds = new(int64)
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	got.wait(t, pod.Name, "terminated", func(p *corev1.Pod) bool { return terminal(p) })
}

func containersRunning(names ...string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		running := map[string]bool{}
		for _, s := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			running[s.Name] = s.State.Running != nil
		}
		for _, n := range names {
			if !running[n] {
				return false
			}
		}
		return true
	}
}

// TestPreStartContainer checks PreStartContainer on the node for each
// backend: the plugin that asked for it (PreStartRequired) gets one call
// per container holding its devices, with exactly that container's
// devices, before the container starts, init containers included; the
// plugin that did not ask gets none, though its devices are in use.
func TestPreStartContainer(t *testing.T) {
	for _, b := range preStartBackends {
		t.Run(b.name, func(t *testing.T) {
			n := startPreStartNode(t, b)
			ctx, root, mgr, p, got := n.ctx, n.root, n.mgr, n.p, n.got
			const pre, plain = "example.com/pre", "example.com/plain"
			// Calls come in container order: init (1 device), then a (2).
			order := []string{"init", "a"}
			withPreStart := &recordingPlugin{
				opts:    &pluginapi.DevicePluginOptions{PreStartRequired: true},
				devices: healthyDevices("p0", "p1", "p2", "p3"),
				onPreStart: func(call int, ids []string) {
					if call < len(order) && b.started(n, order[call]) {
						t.Errorf("PreStartContainer %v came after container %s started", ids, order[call])
					}
				},
			}
			without := &recordingPlugin{opts: &pluginapi.DevicePluginOptions{}, devices: healthyDevices("n0", "n1", "n2", "n3")}
			serveRecording(t, mgr, pre, "pre.sock", withPreStart)
			serveRecording(t, mgr, plain, "plain.sock", without)
			waitManager(t, mgr, "both plugins' devices", allocatableIs(mgr, map[string]int64{pre: 4, plain: 4}))

			always := corev1.ContainerRestartPolicyAlways
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "prestart", Namespace: "ns", UID: "uid-prestart"},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					InitContainers: []corev1.Container{
						{Name: "init", Command: holdingCommand(root, true), Resources: limits(pre, 1)},
						{Name: "side", Command: holdingCommand(root, false), RestartPolicy: &always, Resources: limits(plain, 1)},
					},
					Containers: []corev1.Container{
						{Name: "a", Command: holdingCommand(root, false), Resources: limits(pre, 2, plain, 1)},
						{Name: "b", Command: holdingCommand(root, false)},
					},
				},
			}
			if err := p.CreatePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			got.wait(t, "prestart", "init completed; side, a and b running", func(p *corev1.Pod) bool {
				init := p.Status.InitContainerStatuses
				return containersRunning("side", "a", "b")(p) && len(init) == 2 && init[0].State.Terminated != nil && init[0].State.Terminated.ExitCode == 0
			})
			alloc := mgr.PodAllocation(pod.UID)
			var want [][]string
			for _, c := range order {
				want = append(want, containerIDs(alloc, c, pre))
			}
			if calls := withPreStart.Calls(); !slices.EqualFunc(calls, want, slices.Equal) {
				t.Errorf("PreStartContainer calls %v, want %v (init's devices, then a's)", calls, want)
			}
			if calls := without.Calls(); len(calls) != 0 {
				t.Errorf("plugin without PreStartRequired got PreStartContainer calls %v", calls)
			}
			stopPod(t, ctx, p, got, pod)
		})
	}
}

// TestPreStartPluginGone checks that a container holding devices of a
// plugin that did not ask for PreStartContainer starts even when that
// plugin is gone (disconnected, in its grace period) at the time, as with
// the kubelet, which keeps the endpoint's options until the resource is
// removed. Process backend: the app container starts after an init
// container that waits until the plugin has gone.
func TestPreStartPluginGone(t *testing.T) {
	n := startPreStartNode(t, preStartBackends[1])
	ctx, root, mgr, p, got := n.ctx, n.root, n.mgr, n.p, n.got
	const plain = "example.com/plain"
	stopPlugin := serveRecording(t, mgr, plain, "plain.sock", &recordingPlugin{opts: &pluginapi.DevicePluginOptions{}, devices: healthyDevices("n0", "n1")})
	waitManager(t, mgr, "the plugin's devices", allocatableIs(mgr, map[string]int64{plain: 2}))

	gate := filepath.Join(root, "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gone", Namespace: "ns", UID: "uid-gone"},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{{Name: "init", Command: []string{"sh", "-c", fmt.Sprintf("while [ -e %s ]; do sleep 0.05; done", gate)}}},
			Containers:     []corev1.Container{{Name: "a", Command: holdingCommand(root, false), Resources: limits(plain, 1)}},
		},
	}
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	got.wait(t, "gone", "init running", containersRunning("init"))
	stopPlugin()
	waitManager(t, mgr, "the plugin gone", func() bool { r := mgr.Resources(); return len(r) == 1 && !r[0].Connected })
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	running := got.wait(t, "gone", "a running, or given up", func(p *corev1.Pod) bool {
		return containersRunning("a")(p) || terminal(p) || len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil
	})
	if !containersRunning("a")(running) {
		t.Fatalf("container a did not start with its plugin gone: %+v", running.Status.ContainerStatuses)
	}
	stopPod(t, ctx, p, got, pod)
}

func containerIDs(pa *devicemanager.PodAllocation, container, resource string) []string {
	if pa == nil {
		return nil
	}
	for _, c := range pa.Containers {
		if c.Name != container {
			continue
		}
		for _, r := range c.Resources {
			if r.Resource == resource {
				return r.DeviceIDs
			}
		}
	}
	return nil
}
