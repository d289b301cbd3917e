package cri

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime is a CRI runtime in memory, served over a unix socket: its
// containers run until the test ends them (exit) or they are stopped, and
// write one log line when they start.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	socket string

	mu         sync.Mutex
	seq        int
	sandboxes  map[string]*fakeSandbox
	containers map[string]*fakeContainer
	images     map[string]bool
	pulls      []string // the images PullImage was asked for
	stops      []int64  // the timeouts StopContainer was called with
	// exec answers ExecSync for a running container, by the container's
	// name; nil answers exit 0. It is called without the lock held.
	exec  func(container string, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error)
	execs []string // "<container>: <cmd>" of every ExecSync

	sandboxFailures int         // RunPodSandbox fails this many more times
	sandboxCalls    []time.Time // when RunPodSandbox was called

	// usage is what the stats calls report for every container, exited
	// ones too, and (doubled) for every sandbox; podStats false answers ListPodSandboxStats
	// with podStatsErr.
	usage       fakeUsage
	podStats    bool
	podStatsErr codes.Code // ListPodSandboxStats's error without podStats; Unimplemented when OK
}

// fakeUsage is a sample of the fake's stats.
type fakeUsage struct {
	at              time.Time
	cpuNanoSeconds  uint64
	workingSetBytes uint64
}

type fakeSandbox struct {
	id    string
	cfg   *runtimeapi.PodSandboxConfig
	ready bool
	at    int64
}

type fakeContainer struct {
	id, sandbox string
	cfg         *runtimeapi.ContainerConfig
	state       runtimeapi.ContainerState
	exitCode    int32
	created     int64
	started     int64
	finished    int64
}

func newFakeRuntime(t *testing.T) *fakeRuntime {
	t.Helper()
	f := &fakeRuntime{
		socket:    filepath.Join(t.TempDir(), "cri.sock"),
		sandboxes: map[string]*fakeSandbox{}, containers: map[string]*fakeContainer{},
		images: map[string]bool{"busybox:1": true},
	}
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	runtimeapi.RegisterImageServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeRuntime) nextID(prefix string) string {
	f.seq++
	return fmt.Sprintf("%s%d", prefix, f.seq)
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) RunPodSandbox(_ context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxCalls = append(f.sandboxCalls, time.Now())
	if f.sandboxFailures > 0 {
		f.sandboxFailures--
		return nil, status.Error(codes.Unknown, "failed to setup network for sandbox: plugin type=\"ptp\" failed")
	}
	id := f.nextID("sb")
	f.sandboxes[id] = &fakeSandbox{id: id, cfg: r.Config, ready: true, at: time.Now().UnixNano()}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (f *fakeRuntime) StopPodSandbox(_ context.Context, r *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxes[r.PodSandboxId]; sb != nil {
		sb.ready = false
		for _, c := range f.containers {
			if c.sandbox == sb.id {
				f.exitLocked(c, 137)
			}
		}
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (f *fakeRuntime) RemovePodSandbox(_ context.Context, r *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, r.PodSandboxId)
	for id, c := range f.containers {
		if c.sandbox == r.PodSandboxId {
			delete(f.containers, id)
		}
	}
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PodSandboxId]
	if sb == nil {
		return nil, status.Error(codes.NotFound, "no sandbox")
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: sb.id, Metadata: sb.cfg.Metadata, CreatedAt: sb.at, Network: &runtimeapi.PodSandboxNetworkStatus{Ip: "10.9.9.9"}}}, nil
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListPodSandboxResponse{}
	for _, sb := range f.sandboxes {
		if !matches(sb.cfg.Labels, r.GetFilter().GetLabelSelector()) {
			continue
		}
		out.Items = append(out.Items, &runtimeapi.PodSandbox{Id: sb.id, Metadata: sb.cfg.Metadata, Labels: sb.cfg.Labels, Annotations: sb.cfg.Annotations, CreatedAt: sb.at})
	}
	return out, nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (f *fakeRuntime) CreateContainer(_ context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sandboxes[r.PodSandboxId] == nil {
		return nil, status.Error(codes.NotFound, "no sandbox")
	}
	id := f.nextID("c")
	f.containers[id] = &fakeContainer{id: id, sandbox: r.PodSandboxId, cfg: r.Config, state: runtimeapi.ContainerState_CONTAINER_CREATED, created: time.Now().UnixNano()}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (f *fakeRuntime) StartContainer(_ context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[r.ContainerId]
	if c == nil {
		return nil, status.Error(codes.NotFound, "no container")
	}
	c.state, c.started = runtimeapi.ContainerState_CONTAINER_RUNNING, time.Now().UnixNano()
	// The runtime writes the container's output to the log file.
	path := filepath.Join(f.sandboxes[c.sandbox].cfg.LogDirectory, c.cfg.LogPath)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	line := fmt.Sprintf("%s stdout F started %s attempt %d\n", time.Now().UTC().Format(time.RFC3339Nano), c.cfg.Metadata.Name, c.cfg.Metadata.Attempt)
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		return nil, err
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (f *fakeRuntime) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, r.Timeout)
	if c := f.containers[r.ContainerId]; c != nil {
		f.exitLocked(c, 143)
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

func (f *fakeRuntime) RemoveContainer(_ context.Context, r *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, r.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (f *fakeRuntime) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range f.containers {
		if sb := r.GetFilter().GetPodSandboxId(); sb != "" && c.sandbox != sb {
			continue
		}
		out.Containers = append(out.Containers, &runtimeapi.Container{Id: c.id, PodSandboxId: c.sandbox, Metadata: c.cfg.Metadata, Labels: c.cfg.Labels, State: c.state, CreatedAt: c.created})
	}
	return out, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[r.ContainerId]
	if c == nil {
		return nil, status.Error(codes.NotFound, "no container")
	}
	// As containerd: the mounts asked for, and the log's full path.
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id: c.id, Metadata: c.cfg.Metadata, State: c.state, ExitCode: c.exitCode,
		CreatedAt: c.created, StartedAt: c.started, FinishedAt: c.finished, Image: c.cfg.Image, ImageRef: "sha256:fake",
		Mounts: c.cfg.Mounts, LogPath: filepath.Join(f.sandboxes[c.sandbox].cfg.LogDirectory, c.cfg.LogPath),
	}}, nil
}

func (f *fakeRuntime) ImageStatus(_ context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[r.Image.Image] {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:" + r.Image.Image, Size: 1}}, nil
}

// ImageFsInfo is how the kubelet's image client checks, when it
// connects, that the runtime serves CRI v1's image service.
func (f *fakeRuntime) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

func (f *fakeRuntime) PullImage(_ context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	f.mu.Lock()
	f.pulls = append(f.pulls, r.Image.Image)
	f.mu.Unlock()
	return nil, status.Errorf(codes.Unknown, "failed to pull and unpack image %q: no such host", r.Image.Image)
}

func (f *fakeRuntime) containerStatsLocked(c *fakeContainer) *runtimeapi.ContainerStats {
	u := f.usage
	return &runtimeapi.ContainerStats{
		Attributes: &runtimeapi.ContainerAttributes{Id: c.id, Metadata: c.cfg.Metadata, Labels: c.cfg.Labels},
		Cpu:        &runtimeapi.CpuUsage{Timestamp: u.at.UnixNano(), UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: u.cpuNanoSeconds}},
		Memory:     &runtimeapi.MemoryUsage{Timestamp: u.at.UnixNano(), WorkingSetBytes: &runtimeapi.UInt64Value{Value: u.workingSetBytes}},
	}
}

func (f *fakeRuntime) ListContainerStats(_ context.Context, r *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &runtimeapi.ListContainerStatsResponse{}
	for _, c := range f.containers {
		if matches(c.cfg.Labels, r.GetFilter().GetLabelSelector()) {
			out.Stats = append(out.Stats, f.containerStatsLocked(c))
		}
	}
	return out, nil
}

func (f *fakeRuntime) ListPodSandboxStats(_ context.Context, r *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.podStats {
		code := f.podStatsErr
		if code == codes.OK {
			code = codes.Unimplemented
		}
		return nil, status.Error(code, "no pod sandbox stats")
	}
	out := &runtimeapi.ListPodSandboxStatsResponse{}
	u := f.usage
	for _, sb := range f.sandboxes {
		if !matches(sb.cfg.Labels, r.GetFilter().GetLabelSelector()) {
			continue
		}
		s := &runtimeapi.PodSandboxStats{
			Attributes: &runtimeapi.PodSandboxAttributes{Id: sb.id, Metadata: sb.cfg.Metadata, Labels: sb.cfg.Labels},
			Linux: &runtimeapi.LinuxPodSandboxStats{
				Cpu:    &runtimeapi.CpuUsage{Timestamp: u.at.UnixNano(), UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: 2 * u.cpuNanoSeconds}},
				Memory: &runtimeapi.MemoryUsage{Timestamp: u.at.UnixNano(), WorkingSetBytes: &runtimeapi.UInt64Value{Value: 2 * u.workingSetBytes}},
				Network: &runtimeapi.NetworkUsage{Timestamp: u.at.UnixNano(), DefaultInterface: &runtimeapi.NetworkInterfaceUsage{
					Name: "eth0", RxBytes: &runtimeapi.UInt64Value{Value: 7}, TxBytes: &runtimeapi.UInt64Value{Value: 9},
				}},
			},
		}
		for _, c := range f.containers {
			if c.sandbox == sb.id {
				s.Linux.Containers = append(s.Linux.Containers, f.containerStatsLocked(c))
			}
		}
		out.Stats = append(out.Stats, s)
	}
	return out, nil
}

func (f *fakeRuntime) exitLocked(c *fakeContainer, code int32) {
	if c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	c.state, c.exitCode, c.finished = runtimeapi.ContainerState_CONTAINER_EXITED, code, time.Now().UnixNano()
}

// exit ends the running container name of the sandbox with code.
func (f *fakeRuntime) exit(t *testing.T, name string, code int32) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.cfg.Metadata.Name == name && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			f.exitLocked(c, code)
			return
		}
	}
	t.Fatalf("no running container %s", name)
}

// running returns the config of the running container name.
func (f *fakeRuntime) running(name string) *runtimeapi.ContainerConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.cfg.Metadata.Name == name && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return c.cfg
		}
	}
	return nil
}

// counts returns how many sandboxes and containers the runtime has.
func (f *fakeRuntime) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sandboxes), len(f.containers)
}

func (f *fakeRuntime) ExecSync(_ context.Context, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	f.mu.Lock()
	c := f.containers[r.ContainerId]
	if c == nil || c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		f.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "container is not running")
	}
	name := c.cfg.Metadata.Name
	f.execs = append(f.execs, name+": "+strings.Join(r.Cmd, " "))
	exec := f.exec
	f.mu.Unlock()
	if exec == nil {
		return &runtimeapi.ExecSyncResponse{}, nil
	}
	return exec(name, r)
}

// execCount counts the ExecSync calls whose "<container>: <cmd>" is s.
func (f *fakeRuntime) execCount(s string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range f.execs {
		if e == s {
			n++
		}
	}
	return n
}
