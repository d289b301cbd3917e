package podresources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/unixsock"
)

// SocketPath returns where the kubelet serves the PodResources API below
// its root directory: <root>/pod-resources/kubelet.sock.
func SocketPath(root string) string {
	return filepath.Join(root, "pod-resources", "kubelet.sock")
}

// GRPCServer returns a gRPC server with s registered and the configured
// rate limit installed, for callers that serve on their own listener.
// opts are appended to the server's own options.
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	var all []grpc.ServerOption
	if s.qps > 0 {
		all = append(all, WithRateLimiter(s.qps, s.burst))
	}
	all = append(all, opts...)
	g := grpc.NewServer(all...)
	podresourcesv1.RegisterPodResourcesListerServer(g, s)
	return g
}

// Serve serves the API on the unix socket at socket until ctx is done,
// then stops gracefully and removes the socket. The socket's directory is
// created if needed and a stale socket left at the path is replaced; any
// other file there is an error.
func (s *Server) Serve(ctx context.Context, socket string) error {
	l, err := listen(socket)
	if err != nil {
		return err
	}
	return s.ServeListener(ctx, l)
}

// ServeListener serves the API on l until ctx is done, then stops
// gracefully and closes l. It serves on the calling goroutine: the stop is
// a callback on ctx, not a goroutine waiting for it (a process of
// virtual nodes serves a thousand of these).
func (s *Server) ServeListener(ctx context.Context, l net.Listener) error {
	g := s.GRPCServer()
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		g.GracefulStop()
		close(stopped)
	})
	s.log.Info("Serving PodResources API", "address", l.Addr().String())
	err := g.Serve(l)
	if stop() {
		// Serve failed before ctx ended: no stop is coming.
		_ = l.Close()
		return fmt.Errorf("podresources: serving on %s: %w", l.Addr(), err)
	}
	// ctx ended: Serve returns once the listener closed; the stop ends
	// when in-flight calls have.
	<-stopped
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("podresources: serving on %s: %w", l.Addr(), err)
	}
	return nil
}

func listen(socket string) (net.Listener, error) {
	l, err := unixsock.Listen(socket)
	if err != nil {
		return nil, fmt.Errorf("podresources: %w", err)
	}
	return l, nil
}
