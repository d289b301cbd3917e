// Command pollplugin is the baseline of the lifecycle chaos run on the real
// node (docs/reliability.md): a device plugin written directly against the
// kubelet's v1beta1 API, as many plugins are, that finds out about a
// kubelet restart only by checking every POLL (10 s) whether the
// kubelet's registration socket is a new one, and then registers again.
// dpkit's SDK registers again within milliseconds of the socket's
// creation; the run measures what the difference costs the pods.
//
// It serves COUNT devices of RESOURCE_NAME, each giving the container
// /dev/zero as /dev/dpkit-zero and DPKIT_E2E=from the plugin, on a socket
// named after POD_NAME (two pods of a rolling update serve side by side).
// It is a test program: not part of dpkit.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	resource := os.Getenv("RESOURCE_NAME")
	count, err := strconv.Atoi(os.Getenv("COUNT"))
	if resource == "" || err != nil || count < 1 {
		return fmt.Errorf("set RESOURCE_NAME and COUNT (a positive number): got %q and %q", resource, os.Getenv("COUNT"))
	}
	poll := 10 * time.Second
	if v := os.Getenv("POLL"); v != "" {
		if poll, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("POLL=%q: %w", v, err)
		}
	}
	name := "poll-" + os.Getenv("POD_NAME") + ".sock"
	socket := filepath.Join(pluginapi.DevicePluginPath, name)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The kubelet removes every socket in its directory as it starts:
	// serve afresh when ours is gone.
	var srv *grpc.Server
	serve := func() error {
		if srv != nil {
			srv.Stop()
		}
		_ = os.Remove(socket)
		lis, err := net.Listen("unix", socket)
		if err != nil {
			return err
		}
		srv = grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(srv, &plugin{ctx: ctx, count: count})
		go func(srv *grpc.Server) {
			if err := srv.Serve(lis); err != nil {
				log.Printf("serve: %v", err)
			}
		}(srv)
		return nil
	}
	defer func() {
		if srv != nil {
			srv.Stop()
		}
		_ = os.Remove(socket)
	}()

	registered := uint64(0) // the inode of the kubelet socket registered with
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		// A socket left by an instance killed before (a crash) is
		// served afresh too.
		if srv == nil || inode(socket) == 0 {
			if err := serve(); err != nil {
				return err
			}
			registered = 0
		}
		if ino := inode(pluginapi.KubeletSocket); ino != 0 && ino != registered {
			if err := register(ctx, resource, name); err != nil {
				log.Printf("register: %v", err)
			} else {
				log.Printf("registered %s with the kubelet (socket inode %d)", resource, ino)
				registered = ino
			}
		}
		select {
		case <-ctx.Done():
			log.Print("stopping")
			return nil
		case <-tick.C:
		}
	}
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

func register(ctx context.Context, resource, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	ctx   context.Context
	count int
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	var devs []*pluginapi.Device
	for i := range p.count {
		devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("zero-%d", i), Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	select {
	case <-p.ctx.Done():
		return errors.New("plugin stopping")
	case <-s.Context().Done():
		return nil
	}
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:    map[string]string{"DPKIT_E2E": "from the plugin"},
			Devices: []*pluginapi.DeviceSpec{{HostPath: "/dev/zero", ContainerPath: "/dev/dpkit-zero", Permissions: "rw"}},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
