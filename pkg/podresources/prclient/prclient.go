// Package prclient is a client of the kubelet's PodResources API (v1) on
// its unix socket. It links no Kubernetes API types, so the lean build
// ("dpkit plugin") uses it too; the server side is pkg/podresources.
package prclient

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/unixsock"
)

// MaxMsgSize is the largest answer the client accepts, as the kubelet's
// own client helper (16 MiB).
const MaxMsgSize = 16 * 1024 * 1024

// New returns a client of the PodResources API served on the unix socket
// (the kubelet's is /var/lib/kubelet/pod-resources/kubelet.sock). It
// connects on first use and again after failures; opts add to the
// defaults (unixsock.QuickReconnect, say). Close the connection when done.
func New(socket string, opts ...grpc.DialOption) (podresourcesv1.PodResourcesListerClient, *grpc.ClientConn, error) {
	conn, err := unixsock.NewGRPCClient(socket, append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize)),
	}, opts...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("PodResources %w", err)
	}
	return podresourcesv1.NewPodResourcesListerClient(conn), conn, nil
}

// Dial is New, then waits until the connection is ready or ctx is done;
// give ctx a deadline. The caller closes the returned Closer when done.
func Dial(ctx context.Context, socket string) (podresourcesv1.PodResourcesListerClient, io.Closer, error) {
	client, conn, err := New(socket)
	if err != nil {
		return nil, nil, err
	}
	if err := unixsock.WaitReady(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("PodResources: connecting to %s: %w", socket, err)
	}
	return client, conn, nil
}
