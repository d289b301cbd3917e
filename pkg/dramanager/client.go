package dramanager

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// Client calls a DRA driver's node services in the versions negotiated
// at its registration (Plugin.Service and Plugin.HealthService): the
// v1 or v1beta1 DRAPlugin service, the v1 or v1alpha1 DRAResourceHealth
// service, always speaking v1 messages to its caller, as the kubelet's
// DRAPlugin does (pkg/kubelet/cm/dra/plugin/dra_plugin.go). The manager
// calls its plugins through it; so does dpkit verify --dra, which calls a
// driver directly with requests of its own.
type Client struct {
	conn                   grpc.ClientConnInterface
	service, healthService string
}

// NewClient returns a Client on conn for the negotiated services, as
// Plugins reports them; an empty healthService means the driver serves no
// health.
func NewClient(conn grpc.ClientConnInterface, service, healthService string) Client {
	return Client{conn: conn, service: service, healthService: healthService}
}

// Service and HealthService are the services the Client calls.
func (c Client) Service() string       { return c.service }
func (c Client) HealthService() string { return c.healthService }

// NodePrepareResources calls NodePrepareResources in the negotiated
// version.
func (c Client) NodePrepareResources(ctx context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	if c.service == drav1beta1.DRAPluginService {
		return drav1beta1.V1Beta1ClientWrapper{DRAPluginClient: drav1beta1.NewDRAPluginClient(c.conn)}.NodePrepareResources(ctx, req)
	}
	return drav1.NewDRAPluginClient(c.conn).NodePrepareResources(ctx, req)
}

// NodeUnprepareResources calls NodeUnprepareResources in the negotiated
// version.
func (c Client) NodeUnprepareResources(ctx context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	if c.service == drav1beta1.DRAPluginService {
		return drav1beta1.V1Beta1ClientWrapper{DRAPluginClient: drav1beta1.NewDRAPluginClient(c.conn)}.NodeUnprepareResources(ctx, req)
	}
	return drav1.NewDRAPluginClient(c.conn).NodeUnprepareResources(ctx, req)
}

// NodeWatchResources opens the health stream in the negotiated version.
// Without a health service it fails with Unimplemented, as a driver that
// declines health does.
func (c Client) NodeWatchResources(ctx context.Context) (drahealthv1.DRAResourceHealth_NodeWatchResourcesClient, error) {
	switch c.healthService {
	case drahealthv1.DRAResourceHealthService:
		return drahealthv1.NewDRAResourceHealthClient(c.conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	case drahealthv1alpha1.DRAResourceHealthService:
		return drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(c.conn)}.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	}
	return nil, status.Error(codes.Unimplemented, fmt.Sprintf("the driver registered no DRAResourceHealth service (services %q)", HealthServices))
}

// Negotiate picks the services to call a driver in from the versions of
// its registration, as the manager (and the kubelet) does: the first of
// the driver's DRAPlugin services the manager speaks (drivers list the
// newest first), and the newest DRAResourceHealth service both speak, ""
// when the driver lists none.
func Negotiate(versions []string) (service, healthService string, err error) {
	service, err = chooseService("", versions)
	if err != nil {
		return "", "", err
	}
	return service, chooseHealthService(versions), nil
}
