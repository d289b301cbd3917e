package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

var (
	_ backend.Attacher      = (*Backend)(nil)
	_ backend.PortForwarder = (*Backend)(nil)
)

// runningID returns the runtime ID of the running container of the pod.
func (b *Backend) runningID(namespace, name, container string) (string, error) {
	pr := b.byName(namespace, name)
	if pr == nil {
		return "", fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	if c, ok := pr.w.Container(container); ok && c.Running {
		return c.ID, nil
	}
	return "", fmt.Errorf("container %s in pod %s/%s is not running", container, namespace, name)
}

// Attach implements backend.Attacher through the runtime's streaming
// Attach, as the kubelet does: the container's own stdin (when its spec
// has stdin: true), stdout and stderr, or its TTY, joined to the caller's
// streams until the container ends or ctx does.
func (b *Backend) Attach(ctx context.Context, namespace, name, container string, eio backend.ExecIO) error {
	id, err := b.runningID(namespace, name, container)
	if err != nil {
		return err
	}
	resp, err := b.rt.Attach(b.logctx(ctx), &runtimeapi.AttachRequest{
		ContainerId: id, Tty: eio.TTY,
		Stdin: eio.Stdin != nil, Stdout: eio.Stdout != nil, Stderr: eio.Stderr != nil && !eio.TTY,
	})
	if err != nil {
		return fmt.Errorf("attach to container %s: %w", container, err)
	}
	return streamError("attach to container "+container, stream(ctx, resp.Url, eio))
}

// PortForward implements backend.PortForwarder through the runtime's
// streaming PortForward, as the kubelet does: the runtime connects to the
// port in the pod's network namespace. Each call is one connection: one
// pair of error and data streams on a SPDY connection to the runtime's
// streaming server, stream copied both ways until the pod's side ends or
// ctx does.
func (b *Backend) PortForward(ctx context.Context, namespace, name string, port int32, stream io.ReadWriteCloser) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: must be 1..65535", port)
	}
	pr.mu.Lock()
	sandbox := pr.sandboxID
	pr.mu.Unlock()
	if sandbox == "" {
		return fmt.Errorf("pod %s/%s has no sandbox yet", namespace, name)
	}
	resp, err := b.rt.PortForward(b.logctx(ctx), &runtimeapi.PortForwardRequest{PodSandboxId: sandbox, Port: []int32{port}})
	if err != nil {
		return fmt.Errorf("port-forward to pod %s/%s: %w", namespace, name, err)
	}
	if err := forward(ctx, resp.Url, port, stream); err != nil {
		return fmt.Errorf("port-forward to pod %s/%s port %d: %w", namespace, name, port, err)
	}
	return nil
}

// forward is client-go's portforward handleConnection for one connection
// already open (stream) to the runtime's streaming server at rawURL.
func forward(ctx context.Context, rawURL string, port int32, stream io.ReadWriteCloser) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("the runtime's URL %q: %w", rawURL, err)
	}
	rt, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		return err
	}
	conn, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u).Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return fmt.Errorf("connecting to the runtime's streaming server: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(int(port)))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	errorStream, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("creating the error stream: %w", err)
	}
	_ = errorStream.Close() // nothing is written to it
	errc := make(chan []byte, 1)
	go func() {
		msg, _ := io.ReadAll(errorStream)
		errc <- msg
	}()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("creating the data stream: %w", err)
	}
	go func() {
		// The client's end of input half-closes the pod's side.
		_, _ = io.Copy(data, stream)
		_ = data.Close()
	}()
	_, copyErr := io.Copy(stream, data)
	_ = data.Reset()
	var msg []byte
	select {
	case msg = <-errc:
	case <-ctx.Done():
		return nil
	}
	if len(msg) > 0 {
		return errors.New(strings.TrimSpace(string(msg)))
	}
	if copyErr != nil && ctx.Err() == nil {
		return copyErr
	}
	return nil
}
