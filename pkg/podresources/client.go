package podresources

import (
	"context"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultMaxMsgSize is the largest response the client accepts, as the
// kubelet's client helper (16 MiB).
const DefaultMaxMsgSize = 16 * 1024 * 1024

// Dial connects to the PodResources API at the unix socket and waits until
// the connection is ready or ctx is done; give ctx a deadline. The caller
// closes the returned Closer when done with the client.
func Dial(ctx context.Context, socket string) (podresourcesv1.PodResourcesListerClient, io.Closer, error) {
	conn, err := grpc.NewClient("passthrough:///"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(DefaultMaxMsgSize)),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("podresources: dialing %s: %w", socket, err)
	}
	conn.Connect()
	for {
		st := conn.GetState()
		if st == connectivity.Ready {
			return podresourcesv1.NewPodResourcesListerClient(conn), conn, nil
		}
		if !conn.WaitForStateChange(ctx, st) {
			_ = conn.Close()
			return nil, nil, fmt.Errorf("podresources: connecting to %s (last state %s): %w", socket, st, ctx.Err())
		}
	}
}
