package deviceplugin_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// scripted is a DevicePluginServer whose answers the test sets.
type scripted struct {
	pluginapi.UnimplementedDevicePluginServer
	allocateErr  error
	allocated    *pluginapi.AllocateRequest // the request Allocate got
	response     *pluginapi.AllocateResponse
	lists        []*pluginapi.ListAndWatchResponse
	streamErr    error
	streamCtx    chan context.Context // the stream's context, once sent
	sendAfterEnd chan error           // Send's error once the kubelet ended the stream
}

func (s *scripted) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	s.allocated = req
	return s.response, s.allocateErr
}

func (s *scripted) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for _, l := range s.lists {
		if err := stream.Send(l); err != nil {
			return err
		}
	}
	if s.streamCtx != nil {
		s.streamCtx <- stream.Context()
		<-stream.Context().Done()
		s.sendAfterEnd <- stream.Send(s.lists[0])
	}
	return s.streamErr
}

func code(err error) codes.Code { return status.Code(err) }

// TestInProcessClientUnary: a unary call crosses as over gRPC: messages
// copied both ways, plain errors Unknown, statuses kept, an ended
// context Canceled before the plugin is asked, a nil answer Internal.
func TestInProcessClientUnary(t *testing.T) {
	t.Parallel()
	srv := &scripted{response: &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{Envs: map[string]string{"A": "1"}}}}}
	c := deviceplugin.InProcessClient(srv)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"d0"}}}}
	resp, err := c.Allocate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	req.ContainerRequests[0].DevicesIds[0] = "changed by the kubelet"
	resp.ContainerResponses[0].Envs["A"] = "changed by the kubelet"
	if got := srv.allocated.ContainerRequests[0].DevicesIds[0]; got != "d0" {
		t.Errorf("the plugin's request changed with the kubelet's: %q", got)
	}
	if got := srv.response.ContainerResponses[0].Envs["A"]; got != "1" {
		t.Errorf("the plugin's response changed with the kubelet's: %q", got)
	}

	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
		msg  string
	}{
		{"plain error", errors.New("no such device d9"), codes.Unknown, "no such device d9"},
		{"status", status.Error(codes.Unavailable, "stopping"), codes.Unavailable, "stopping"},
	} {
		srv := &scripted{allocateErr: tc.err}
		_, err := deviceplugin.InProcessClient(srv).Allocate(context.Background(), req)
		if code(err) != tc.want || status.Convert(err).Message() != tc.msg {
			t.Errorf("%s: %v, want %s %q", tc.name, err, tc.want, tc.msg)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	srv = &scripted{response: &pluginapi.AllocateResponse{}}
	if _, err := deviceplugin.InProcessClient(srv).Allocate(ctx, req); code(err) != codes.Canceled || srv.allocated != nil {
		t.Errorf("ended context: %v (plugin asked: %v), want Canceled without asking", err, srv.allocated != nil)
	}
	if _, err := deviceplugin.InProcessClient(&scripted{}).Allocate(context.Background(), req); code(err) != codes.Internal {
		t.Errorf("nil response: %v, want Internal", err)
	}
}

func list(ids ...string) *pluginapi.ListAndWatchResponse {
	l := &pluginapi.ListAndWatchResponse{}
	for _, id := range ids {
		l.Devices = append(l.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return l
}

// TestInProcessClientListAndWatch: the stream carries the plugin's lists
// in order and ends as gRPC ends it: io.EOF when the plugin returns, its
// error as a status, ResourceExhausted for a list over the kubelet's
// limit, and, when the kubelet cancels, the plugin's context ends and
// its Send fails.
func TestInProcessClientListAndWatch(t *testing.T) {
	t.Parallel()
	recvAll := func(srv *scripted) ([]string, error) {
		stream, err := deviceplugin.InProcessClient(srv).ListAndWatch(context.Background(), &pluginapi.Empty{})
		if err != nil {
			return nil, err
		}
		var got []string
		for {
			l, err := stream.Recv()
			if err != nil {
				return got, err
			}
			var ids []string
			for _, d := range l.Devices {
				ids = append(ids, d.ID)
			}
			got = append(got, strings.Join(ids, ","))
		}
	}
	got, err := recvAll(&scripted{lists: []*pluginapi.ListAndWatchResponse{list("a"), list("a", "b")}})
	if !errors.Is(err, io.EOF) || strings.Join(got, " ") != "a a,b" {
		t.Errorf("lists %q ending %v, want [a a,b] then io.EOF", got, err)
	}
	if _, err := recvAll(&scripted{streamErr: errors.New("scan failed")}); code(err) != codes.Unknown || status.Convert(err).Message() != "scan failed" {
		t.Errorf("plugin error: %v, want Unknown scan failed", err)
	}
	big := list(strings.Repeat("x", deviceplugin.KubeletMaxMessageSize))
	if _, err := recvAll(&scripted{lists: []*pluginapi.ListAndWatchResponse{big}}); code(err) != codes.ResourceExhausted {
		t.Errorf("list over the limit: %v, want ResourceExhausted", err)
	}

	srv := &scripted{lists: []*pluginapi.ListAndWatchResponse{list("a")}, streamCtx: make(chan context.Context, 1), sendAfterEnd: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := deviceplugin.InProcessClient(srv).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	pctx := <-srv.streamCtx
	cancel()
	<-pctx.Done()
	if err := <-srv.sendAfterEnd; code(err) != codes.Canceled {
		t.Errorf("Send after the kubelet ended the stream: %v, want Canceled", err)
	}
	// Every time: the stream's end and the cancel are both there to see.
	for range 10 {
		if _, err := stream.Recv(); code(err) != codes.Canceled {
			t.Fatalf("Recv after cancel: %v, want Canceled", err)
		}
	}
}

// pushing is the in-process client's ListAndWatchTo, which the device
// manager uses when a client has it.
type pushing interface {
	ListAndWatchTo(context.Context, *pluginapi.Empty, func(*pluginapi.ListAndWatchResponse) error) error
}

// TestInProcessClientListAndWatchTo: the lists reach the caller's recv in
// order and the stream ends as ListAndWatch's does (io.EOF, the plugin's
// error as a status, ResourceExhausted over the limit, Canceled with the
// plugin's context ended when the kubelet cancels); recv's error ends it,
// the plugin's Send returning it.
func TestInProcessClientListAndWatchTo(t *testing.T) {
	t.Parallel()
	recvAll := func(ctx context.Context, srv *scripted, recv func(*pluginapi.ListAndWatchResponse) error) ([]string, error) {
		c, ok := deviceplugin.InProcessClient(srv).(pushing)
		if !ok {
			t.Fatal("the in-process client has no ListAndWatchTo")
		}
		var got []string
		err := c.ListAndWatchTo(ctx, &pluginapi.Empty{}, func(l *pluginapi.ListAndWatchResponse) error {
			var ids []string
			for _, d := range l.Devices {
				ids = append(ids, d.ID)
			}
			got = append(got, strings.Join(ids, ","))
			if recv != nil {
				return recv(l)
			}
			return nil
		})
		return got, err
	}
	bg := context.Background()
	got, err := recvAll(bg, &scripted{lists: []*pluginapi.ListAndWatchResponse{list("a"), list("a", "b")}}, nil)
	if !errors.Is(err, io.EOF) || strings.Join(got, " ") != "a a,b" {
		t.Errorf("lists %q ending %v, want [a a,b] then io.EOF", got, err)
	}
	if _, err := recvAll(bg, &scripted{streamErr: errors.New("scan failed")}, nil); code(err) != codes.Unknown || status.Convert(err).Message() != "scan failed" {
		t.Errorf("plugin error: %v, want Unknown scan failed", err)
	}
	big := list(strings.Repeat("x", deviceplugin.KubeletMaxMessageSize))
	if got, err := recvAll(bg, &scripted{lists: []*pluginapi.ListAndWatchResponse{big, list("a")}}, nil); code(err) != codes.ResourceExhausted || len(got) != 0 {
		t.Errorf("list over the limit: %d lists, %v, want none and ResourceExhausted", len(got), err)
	}
	if got, err := recvAll(bg, &scripted{lists: []*pluginapi.ListAndWatchResponse{list("a"), list("b")}}, func(*pluginapi.ListAndWatchResponse) error {
		return errors.New("full")
	}); code(err) != codes.Unknown || len(got) != 1 {
		t.Errorf("recv failing: %d lists, %v, want the first and Unknown full", len(got), err)
	}

	srv := &scripted{lists: []*pluginapi.ListAndWatchResponse{list("a")}, streamCtx: make(chan context.Context, 1), sendAfterEnd: make(chan error, 1)}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := recvAll(ctx, srv, nil)
		done <- err
	}()
	pctx := <-srv.streamCtx
	cancel()
	<-pctx.Done()
	if err := <-srv.sendAfterEnd; code(err) != codes.Canceled {
		t.Errorf("Send after the kubelet ended the stream: %v, want Canceled", err)
	}
	if err := <-done; code(err) != codes.Canceled {
		t.Errorf("stream's end after cancel: %v, want Canceled", err)
	}
	if _, err := recvAll(ctx, srv, nil); code(err) != codes.Canceled {
		t.Errorf("ListAndWatchTo with an ended context: %v, want Canceled", err)
	}
}

// TestInProcessConfig: the in-process registration needs its kubelet,
// and a kubelet in process does not go with a socket registration.
func TestInProcessConfig(t *testing.T) {
	t.Parallel()
	res := deviceplugin.Resource{Name: "example.com/foo", Plugin: nopPlugin{}}
	for _, tc := range []struct {
		name string
		cfg  deviceplugin.Config
		want string
	}{
		{"in-process without a kubelet", deviceplugin.Config{PluginDir: t.TempDir(), Registration: deviceplugin.RegistrationInProcess}, "config.Registration: in-process needs config.InProcess"},
		{"a kubelet with a socket mode", deviceplugin.Config{PluginDir: t.TempDir(), Registration: deviceplugin.RegistrationKubelet, InProcess: nopKubelet{}}, `config.InProcess: set with Registration "kubelet"`},
	} {
		if _, err := deviceplugin.NewServer(tc.cfg, res); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	s, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: t.TempDir(), InProcess: nopKubelet{}}, res)
	if err != nil || s.Mode() != deviceplugin.RegistrationInProcess {
		t.Errorf("auto with a kubelet in process: mode %v (%v), want in-process", s.Mode(), err)
	}
}

type nopKubelet struct{}

func (nopKubelet) ConnectInProcess(context.Context, string, string, pluginapi.DevicePluginClient) error {
	return nil
}

type nopPlugin struct{}

func (nopPlugin) Scan(ctx context.Context, _ func([]deviceplugin.Device)) error {
	<-ctx.Done()
	return nil
}

func (nopPlugin) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// watching is the in-process client's WatchDevices, which the device
// manager uses when a client has it.
type watching interface {
	WatchDevices(send func(*pluginapi.ListAndWatchResponse) error, ended func(error)) (stop func())
}

// capturingKubelet hands the test the client of each in-process
// registration.
type capturingKubelet chan pluginapi.DevicePluginClient

func (k capturingKubelet) ConnectInProcess(_ context.Context, _, _ string, c pluginapi.DevicePluginClient) error {
	k <- c
	return nil
}

// TestInProcessWatchDevices: an SDK server's lists reach a watcher on the
// plugin's goroutine: the current one before WatchDevices returns, each
// change in order; the watcher counts as a stream; stop ends it without
// telling ended; the server's stop ends the others with io.EOF.
func TestInProcessWatchDevices(t *testing.T) {
	t.Parallel()
	k := make(capturingKubelet, 1)
	p := newTestPlugin(2)
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: t.TempDir(), InProcess: k}, deviceplugin.Resource{Name: res, Plugin: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var stopped error
	stopServer := sync.OnceFunc(func() {
		cancel()
		stopped = <-done
	})
	defer stopServer()
	c, ok := (<-k).(watching)
	if !ok {
		t.Fatal("the in-process client has no WatchDevices")
	}
	lists := make(chan string, 10)
	send := func(l *pluginapi.ListAndWatchResponse) error {
		var ids []string
		for _, d := range l.Devices {
			ids = append(ids, d.ID+":"+d.Health)
		}
		lists <- strings.Join(ids, ",")
		return nil
	}
	ended := make(chan error, 1)
	stop := c.WatchDevices(send, func(err error) { ended <- err })
	defer stop()
	select {
	case l := <-lists:
		if l != "dev-0:Healthy,dev-1:Healthy" {
			t.Fatalf("first list %q", l)
		}
	default:
		t.Fatal("no list by the time WatchDevices returned")
	}
	p.set("dev-1", false)
	if l := <-lists; l != "dev-0:Healthy,dev-1:Unhealthy" {
		t.Fatalf("after a health change: %q", l)
	}
	other := c.WatchDevices(func(*pluginapi.ListAndWatchResponse) error { return nil }, func(err error) { t.Errorf("a stopped watcher told %v", err) })
	if n := srv.Status()[0].Streams; n != 2 {
		t.Fatalf("%d streams with two watchers", n)
	}
	other()
	if n := srv.Status()[0].Streams; n != 1 {
		t.Fatalf("%d streams after one watcher stopped", n)
	}
	stopServer()
	if stopped != nil {
		t.Fatal(stopped)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, io.EOF) {
			t.Errorf("the server's stop: %v, want io.EOF", err)
		}
	default:
		t.Error("the server stopped; the watcher was not told")
	}
}
