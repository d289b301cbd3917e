package deviceplugin

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// InProcessClient returns a DevicePluginClient that calls srv in this
// process, as a gRPC client calls a plugin over its socket, without the
// socket, the connection and their goroutines. What crosses is what gRPC
// would carry: messages are copied both ways, so neither side holds the
// other's; errors are gRPC statuses (a plain error is Unknown, a context's
// end is Canceled or DeadlineExceeded); a ListAndWatch message over the
// kubelet's 4 MiB receive limit ends the stream with ResourceExhausted, as
// the kubelet's connection does. Call options are ignored.
func InProcessClient(srv pluginapi.DevicePluginServer) pluginapi.DevicePluginClient {
	return inProcessClient{srv: srv}
}

type inProcessClient struct{ srv pluginapi.DevicePluginServer }

// unary calls one method of the plugin as gRPC would.
func unary[Req, Resp proto.Message](ctx context.Context, call func(context.Context, Req) (Resp, error), req Req) (Resp, error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, status.FromContextError(err).Err()
	}
	resp, err := call(ctx, proto.Clone(req).(Req))
	if err != nil {
		return zero, status.Convert(err).Err()
	}
	if !resp.ProtoReflect().IsValid() {
		// What gRPC answers when it cannot marshal a nil response.
		return zero, status.Error(codes.Internal, "grpc: error while marshaling: proto: Marshal called with nil")
	}
	return proto.Clone(resp).(Resp), nil
}

func (c inProcessClient) GetDevicePluginOptions(ctx context.Context, in *pluginapi.Empty, _ ...grpc.CallOption) (*pluginapi.DevicePluginOptions, error) {
	return unary(ctx, c.srv.GetDevicePluginOptions, in)
}

func (c inProcessClient) GetPreferredAllocation(ctx context.Context, in *pluginapi.PreferredAllocationRequest, _ ...grpc.CallOption) (*pluginapi.PreferredAllocationResponse, error) {
	return unary(ctx, c.srv.GetPreferredAllocation, in)
}

func (c inProcessClient) Allocate(ctx context.Context, in *pluginapi.AllocateRequest, _ ...grpc.CallOption) (*pluginapi.AllocateResponse, error) {
	return unary(ctx, c.srv.Allocate, in)
}

func (c inProcessClient) PreStartContainer(ctx context.Context, in *pluginapi.PreStartContainerRequest, _ ...grpc.CallOption) (*pluginapi.PreStartContainerResponse, error) {
	return unary(ctx, c.srv.PreStartContainer, in)
}

// ListAndWatch runs the plugin's handler for the stream; it ends when the
// handler returns (io.EOF, or its error as a status) or ctx ends.
func (c inProcessClient) ListAndWatch(ctx context.Context, in *pluginapi.Empty, _ ...grpc.CallOption) (grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse], error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	s := &inProcessStream{caller: caller, ctx: ctx, msgs: make(chan *pluginapi.ListAndWatchResponse), done: make(chan struct{})}
	req := proto.Clone(in).(*pluginapi.Empty)
	go func() {
		defer cancel() // as gRPC ends a stream's context with its handler
		s.err = c.srv.ListAndWatch(req, inProcessServerStream{s})
		close(s.done)
	}()
	return inProcessClientStream{s}, nil
}

// ListAndWatchTo runs the plugin's ListAndWatch handler on the caller's
// goroutine and hands each list to recv as the handler sends it: what
// ListAndWatch and Recv do, without the goroutine that runs the handler
// (one fewer for each of the thousand nodes of a process). recv gets a
// copy; its error ends the stream, the handler's Send returning it. The
// return is what Recv returns at the stream's end: io.EOF when the
// handler returned, its error as a status, ResourceExhausted for a list
// over the kubelet's limit, the caller's cancel as gRPC's status.
func (c inProcessClient) ListAndWatchTo(ctx context.Context, in *pluginapi.Empty, recv func(*pluginapi.ListAndWatchResponse) error) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // as gRPC ends a stream's context with its handler
	s := &pushStream{ctx: ctx, recv: recv}
	err := c.srv.ListAndWatch(proto.Clone(in).(*pluginapi.Empty), s)
	switch {
	case s.err != nil:
		return s.err
	case caller.Err() != nil:
		return status.FromContextError(caller.Err()).Err()
	case err != nil:
		return status.Convert(err).Err()
	}
	return io.EOF
}

// pushStream is the plugin's end of a ListAndWatchTo stream.
// overKubeletLimit is what the kubelet's connection answers a
// ListAndWatch message over its 4 MiB receive limit: ResourceExhausted,
// with gRPC's text; nil for one within it.
func overKubeletLimit(m *pluginapi.ListAndWatchResponse) error {
	if n := proto.Size(m); n > KubeletMaxMessageSize {
		return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, KubeletMaxMessageSize)
	}
	return nil
}

type pushStream struct {
	ctx  context.Context
	recv func(*pluginapi.ListAndWatchResponse) error
	err  error // what ended the stream on the kubelet's side
}

func (p *pushStream) Send(m *pluginapi.ListAndWatchResponse) error {
	if p.err != nil {
		return p.err
	}
	if err := p.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if err := overKubeletLimit(m); err != nil {
		p.err = err
		return p.err
	}
	if err := p.recv(proto.Clone(m).(*pluginapi.ListAndWatchResponse)); err != nil {
		p.err = status.Convert(err).Err()
		return p.err
	}
	return nil
}

func (p *pushStream) SetHeader(metadata.MD) error  { return nil }
func (p *pushStream) SendHeader(metadata.MD) error { return nil }
func (p *pushStream) SetTrailer(metadata.MD)       {}
func (p *pushStream) Context() context.Context     { return p.ctx }
func (p *pushStream) RecvMsg(any) error            { return io.EOF }

func (p *pushStream) SendMsg(m any) error {
	msg, ok := m.(*pluginapi.ListAndWatchResponse)
	if !ok {
		return status.Error(codes.Internal, fmt.Sprintf("ListAndWatch carries ListAndWatchResponse, not %T", m))
	}
	return p.Send(msg)
}

// inProcessStream is one ListAndWatch stream. msgs is unbuffered: a Send
// returns once Recv took the message, so none is left when done closes.
type inProcessStream struct {
	// caller is the kubelet's context; ctx, the plugin's, ends with it
	// and when the handler returns.
	caller context.Context
	ctx    context.Context
	msgs   chan *pluginapi.ListAndWatchResponse
	done   chan struct{} // closed when the handler returned, err set
	err    error
}

// inProcessClientStream is the kubelet's end of the stream.
type inProcessClientStream struct{ s *inProcessStream }

func (c inProcessClientStream) Recv() (*pluginapi.ListAndWatchResponse, error) {
	s := c.s
	select {
	case m := <-s.msgs:
		if err := overKubeletLimit(m); err != nil {
			return nil, err
		}
		return m, nil
	case <-s.done:
		switch {
		case s.caller.Err() != nil:
			// The handler saw the kubelet's cancel; gRPC says so too.
			return nil, status.FromContextError(s.caller.Err()).Err()
		case s.err != nil:
			return nil, status.Convert(s.err).Err()
		}
		return nil, io.EOF
	case <-s.caller.Done():
		return nil, status.FromContextError(s.caller.Err()).Err()
	}
}

func (c inProcessClientStream) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (c inProcessClientStream) Trailer() metadata.MD         { return metadata.MD{} }
func (c inProcessClientStream) CloseSend() error             { return nil }
func (c inProcessClientStream) Context() context.Context     { return c.s.caller }

func (c inProcessClientStream) SendMsg(any) error {
	return status.Error(codes.Internal, "ListAndWatch takes no message after its request")
}

func (c inProcessClientStream) RecvMsg(m any) error {
	msg, err := c.Recv()
	if err != nil {
		return err
	}
	dst, ok := m.(*pluginapi.ListAndWatchResponse)
	if !ok {
		return status.Error(codes.Internal, fmt.Sprintf("ListAndWatch carries ListAndWatchResponse, not %T", m))
	}
	proto.Reset(dst)
	proto.Merge(dst, msg)
	return nil
}

// inProcessServerStream is the plugin's end of the stream.
type inProcessServerStream struct{ s *inProcessStream }

func (p inProcessServerStream) Send(m *pluginapi.ListAndWatchResponse) error {
	select {
	case p.s.msgs <- proto.Clone(m).(*pluginapi.ListAndWatchResponse):
		return nil
	case <-p.s.ctx.Done():
		return status.FromContextError(p.s.ctx.Err()).Err()
	}
}

func (p inProcessServerStream) SetHeader(metadata.MD) error  { return nil }
func (p inProcessServerStream) SendHeader(metadata.MD) error { return nil }
func (p inProcessServerStream) SetTrailer(metadata.MD)       {}
func (p inProcessServerStream) Context() context.Context     { return p.s.ctx }
func (p inProcessServerStream) RecvMsg(any) error            { return io.EOF }

func (p inProcessServerStream) SendMsg(m any) error {
	msg, ok := m.(*pluginapi.ListAndWatchResponse)
	if !ok {
		return status.Error(codes.Internal, fmt.Sprintf("ListAndWatch carries ListAndWatchResponse, not %T", m))
	}
	return p.Send(msg)
}

// WatchDevices is ListAndWatch for a caller in this process that takes
// each list on the plugin's goroutine: send gets the current list, then
// each new one, in order, on the goroutine that changed it; the stream's
// end is told to ended as Recv would return it (io.EOF when the plugin
// stops, ResourceExhausted for a list over the kubelet's limit, send's
// error as a status); stop ends it from the caller's side, ended not
// told. For the SDK's own server no goroutine waits on the stream: one
// fewer for each of the thousand nodes of a process. Another server's
// ListAndWatch runs on a goroutine of its own (ListAndWatchTo), which
// stop waits for. send and ended must not call stop.
func (c inProcessClient) WatchDevices(send func(*pluginapi.ListAndWatchResponse) error, ended func(error)) (stop func()) {
	if svc, ok := c.srv.(service); ok {
		return svc.r.pushDevices(send, ended)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := c.ListAndWatchTo(ctx, &pluginapi.Empty{}, send)
		if ctx.Err() == nil {
			ended(err)
		}
	}()
	return func() { cancel(); <-done }
}
