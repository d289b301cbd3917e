package unixsock

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// NewGRPCClient returns a gRPC client connection to the unix socket at
// path, without transport security (the kubelet's sockets have none). It
// connects on first use and again after failures; opts add to or override
// those defaults. The error names path.
func NewGRPCClient(path string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+path, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return conn, nil
}

// WaitReady starts connecting conn and waits until it is ready or ctx is
// done; the error then names the last state seen.
func WaitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("%w (last state %s)", ctx.Err(), s)
		}
	}
}

// QuickReconnect is the reconnect policy for a server on this node that
// comes back within seconds when it restarts (the kubelet, a plugin):
// tries from 100 ms apart up to 1 s apart, not gRPC's default of up to two
// minutes, each attempt given minConnect.
func QuickReconnect(minConnect time.Duration) grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
		BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
	}, MinConnectTimeout: minConnect})
}
