package exporter

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// lister reads the PodResources API over one connection, which gRPC
// re-establishes when the socket is served again.
type lister struct {
	conn    *grpc.ClientConn
	client  podresourcesv1.PodResourcesListerClient
	timeout time.Duration
}

func newLister(socket string, timeout time.Duration) (*lister, error) {
	// A restarted kubelet serves its socket again within seconds: do not
	// wait gRPC's default two minutes to try it.
	client, conn, err := prclient.New(socket, unixsock.QuickReconnect(timeout))
	if err != nil {
		return nil, err
	}
	return &lister{conn: conn, client: client, timeout: timeout}, nil
}

func (l *lister) close() error { return l.conn.Close() }

// read calls List and GetAllocatableResources. A call that finds the
// connection broken (the kubelet restarted) is tried once more on a new
// connection, waiting for it up to the timeout.
func (l *lister) read(ctx context.Context, reqs *prometheus.CounterVec) ([]*podresourcesv1.PodResources, *podresourcesv1.AllocatableResourcesResponse, error) {
	list, err := call(ctx, l, reqs, "List", func(ctx context.Context, opts ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
		return l.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{}, opts...)
	})
	if err != nil {
		return nil, nil, err
	}
	alloc, err := call(ctx, l, reqs, "GetAllocatableResources", func(ctx context.Context, opts ...grpc.CallOption) (*podresourcesv1.AllocatableResourcesResponse, error) {
		return l.client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{}, opts...)
	})
	if status.Code(err) == codes.Unimplemented {
		// An older kubelet, or one without the feature: no allocatable counts.
		return list.GetPodResources(), &podresourcesv1.AllocatableResourcesResponse{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return list.GetPodResources(), alloc, nil
}

func call[T any](ctx context.Context, l *lister, reqs *prometheus.CounterVec, method string, f func(context.Context, ...grpc.CallOption) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	out, err := f(cctx)
	reqs.WithLabelValues(method, status.Code(err).String()).Inc()
	if status.Code(err) == codes.Unavailable {
		l.conn.ResetConnectBackoff()
		out, err = f(cctx, grpc.WaitForReady(true))
		reqs.WithLabelValues(method, status.Code(err).String()).Inc()
	}
	if err != nil {
		return out, fmt.Errorf("%s: %w", method, err)
	}
	return out, nil
}
