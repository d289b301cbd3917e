package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// service implements the kubelet's DevicePlugin gRPC service (and, in
// registry mode, the plugin watcher's Registration service) for one
// resource.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	r *resource
}

// SDKHeader is the gRPC response header with which the SDK answers
// GetDevicePluginOptions, the call the kubelet makes on every
// registration. It tells a tool that talks to the plugin (dpkit verify)
// that the plugin is built on this SDK, so that its advice can name the
// SDK's calls rather than the raw gRPC API. The kubelet ignores it.
const SDKHeader = "dpkit-sdk"

// sdkHeaderValue is SDKHeader's value: the SDK's package.
const sdkHeaderValue = "pkg/deviceplugin"

func (s service) GetDevicePluginOptions(ctx context.Context, _ *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	// Best effort: an error means the call has already ended.
	_ = grpc.SetHeader(ctx, metadata.Pairs(SDKHeader, sdkHeaderValue))
	return s.r.options(), nil
}

func (s service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	r := s.r
	wake, cancel := r.devices.watch()
	defer cancel()
	r.streamOpened()
	ended := streamEndedByServer
	defer func() { r.streamClosed(ended) }()
	// A plugin watcher may find the socket before the plugin's first
	// scan: its first message waits for the devices.
	if !r.awaitFirstScan(stream.Context(), "listing") {
		if stream.Context().Err() != nil {
			ended = streamEndedByKubelet
		}
		return nil
	}

	sent := ^uint64(0)
	for {
		snap := r.devices.current()
		if snap.version != sent {
			if err := stream.Send(snap.msg); err != nil {
				ended = streamEndedByKubelet
				return err
			}
			sent = snap.version
		}
		select {
		case <-wake:
		case <-stream.Context().Done():
			ended = streamEndedByKubelet
			return nil
		case <-r.stopping:
			return nil
		}
	}
}

func (s service) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	start := s.r.cfg.Clock.Now()
	resp, err := s.allocate(ctx, req)
	s.r.metrics.allocate(s.r.name, status.Code(err).String(), s.r.cfg.Clock.Since(start).Seconds())
	if err != nil {
		s.r.log.Warn("Allocate refused", "err", err)
	}
	return resp, err
}

func (s service) allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	r := s.r
	if len(req.GetContainerRequests()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "AllocateRequest has no container requests")
	}
	snap := r.devices.current()
	for i, creq := range req.ContainerRequests {
		if err := checkAllocatable(snap, fmt.Sprintf("containerRequests[%d]", i), creq.GetDevicesIds()); err != nil {
			return nil, err
		}
	}
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, len(req.ContainerRequests))}
	for i, creq := range req.ContainerRequests {
		cr, err := r.plugin.Allocate(ctx, slices.Clone(creq.DevicesIds))
		if err != nil {
			return nil, toStatus(err, fmt.Sprintf("allocate %s devices %v", r.name, creq.DevicesIds))
		}
		if cr == nil {
			cr = &pluginapi.ContainerAllocateResponse{}
		}
		resp.ContainerResponses[i] = cr
	}
	return resp, nil
}

// checkAllocatable refuses an empty list, duplicates, unknown IDs
// (InvalidArgument) and unhealthy devices (FailedPrecondition).
func checkAllocatable(snap *snapshot, field string, ids []string) error {
	if len(ids) == 0 {
		return status.Errorf(codes.InvalidArgument, "%s: no device IDs requested", field)
	}
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if _, dup := seen[id]; dup {
			return status.Errorf(codes.InvalidArgument, "%s: device %q requested twice", field, id)
		}
		seen[id] = struct{}{}
		d, ok := snap.byID[id]
		if !ok {
			return status.Errorf(codes.InvalidArgument, "%s: unknown device %q", field, id)
		}
		if !d.Healthy {
			return status.Errorf(codes.FailedPrecondition, "%s: device %q is unhealthy", field, id)
		}
	}
	return nil
}

func (s service) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	r := s.r
	if r.preferred == nil {
		return nil, status.Error(codes.Unimplemented, "this plugin does not offer preferred allocation (GetPreferredAllocationAvailable is false)")
	}
	snap := r.devices.current()
	resp := &pluginapi.PreferredAllocationResponse{ContainerResponses: make([]*pluginapi.ContainerPreferredAllocationResponse, len(req.GetContainerRequests()))}
	for i, creq := range req.GetContainerRequests() {
		preq := PreferredAllocationRequest{
			Available:   make([]Device, 0, len(creq.AvailableDeviceIDs)),
			MustInclude: slices.Clone(creq.MustIncludeDeviceIDs),
			Size:        int(creq.AllocationSize),
		}
		for _, id := range creq.AvailableDeviceIDs {
			d, ok := snap.byID[id]
			if !ok {
				d = Device{ID: id}
			}
			preq.Available = append(preq.Available, d)
		}
		ids, err := r.preferred.PreferredAllocation(ctx, preq)
		if err != nil {
			return nil, toStatus(err, fmt.Sprintf("preferred allocation for %s", r.name))
		}
		fixed := repairPreferred(preq, ids)
		if !slices.Equal(fixed, ids) {
			r.log.Warn("Preferred allocation answer corrected to honour the kubelet's request",
				"answer", ids, "corrected", fixed, "size", preq.Size, "mustInclude", preq.MustInclude)
		}
		resp.ContainerResponses[i] = &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: fixed}
	}
	return resp, nil
}

// repairPreferred makes an answer valid for the kubelet: only available
// IDs, no duplicates, every mustInclude ID, and Size IDs when enough are
// available (topped up in the kubelet's order).
func repairPreferred(req PreferredAllocationRequest, ids []string) []string {
	available := make(map[string]bool, len(req.Available))
	for _, d := range req.Available {
		available[d.ID] = true
	}
	out := make([]string, 0, req.Size)
	taken := make(map[string]bool, req.Size)
	add := func(id string) {
		if len(out) < req.Size && available[id] && !taken[id] {
			taken[id] = true
			out = append(out, id)
		}
	}
	for _, id := range req.MustInclude {
		add(id)
	}
	for _, id := range ids {
		add(id)
	}
	for _, d := range req.Available {
		if d.Healthy {
			add(d.ID)
		}
	}
	// Keep the author's order when the answer was already valid.
	if len(out) == len(ids) {
		same := true
		for _, id := range ids {
			if !taken[id] {
				same = false
				break
			}
		}
		if same {
			return slices.Clone(ids)
		}
	}
	return out
}

func (s service) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	r := s.r
	if r.prestart == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	if err := r.prestart.PreStartContainer(ctx, slices.Clone(req.GetDevicesIds())); err != nil {
		return nil, toStatus(err, fmt.Sprintf("pre-start %s devices %v", r.name, req.GetDevicesIds()))
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// toStatus converts an error from the plugin author's code into a gRPC
// status, keeping the author's message (and code, when it has one).
func toStatus(err error, what string) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: %v", what, err)
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

// registrationService answers the kubelet's plugin watcher.
type registrationService struct {
	registerapi.UnimplementedRegistrationServer
	r *resource
	// listen numbers the socket this service is served on (see
	// resource.listen); verdicts on older sockets are ignored.
	listen int
}

func (s registrationService) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              s.r.name,
		Endpoint:          s.r.socket(),
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

func (s registrationService) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		if s.r.setRegisteredFrom(s.listen, true, nil) {
			s.r.log.Info("Registered with the kubelet's plugin watcher")
		}
	} else {
		err := fmt.Errorf("kubelet refused registration: %s", st.Error)
		if s.r.setRegisteredFrom(s.listen, false, err) {
			s.r.log.Error("Registration through the plugin watcher failed", "err", st.Error)
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
