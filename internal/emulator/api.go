package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"time"

	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

// AdminSocket returns where "dpkit kubelet" serves its admin API below
// root.
func AdminSocket(root string) string { return filepath.Join(root, "dpkit", "admin.sock") }

// Resource is one extended resource served by device plugins.
type Resource struct {
	Name        string `json:"name"`
	Capacity    int64  `json:"capacity"`
	Allocatable int64  `json:"allocatable"`
	InUse       int64  `json:"inUse"`
	Connected   bool   `json:"connected"`
}

// Device is one device of a resource.
type Device struct {
	Resource  string  `json:"resource"`
	ID        string  `json:"id"`
	Healthy   bool    `json:"healthy"`
	NUMANodes []int64 `json:"numaNodes,omitempty"`
	PodUID    string  `json:"podUID,omitempty"`
	// Pod is the namespace/name of the pod PodUID names, when the
	// emulator knows it.
	Pod string `json:"pod,omitempty"`
}

// Pod is an admitted pod with its devices.
type Pod struct {
	Namespace  string      `json:"namespace"`
	Name       string      `json:"name"`
	UID        string      `json:"uid"`
	Containers []Container `json:"containers,omitempty"`
	// Warnings are said about an admission: resources the pod asks for
	// that no device plugin serves, each with its field path. Only the
	// answer to an admission has them.
	Warnings []string `json:"warnings,omitempty"`
}

// Container lists one container's devices and what the container runtime
// is told to give it.
type Container struct {
	Name string `json:"name"`
	// Type is ContainerTypeInit, ContainerTypeSidecar or ContainerTypeApp.
	Type    string       `json:"type,omitempty"`
	Devices []Allocation `json:"devices,omitempty"`
	// Claims are the DRA claims the container uses, prepared by their
	// drivers; their CDI devices are in Options.
	Claims []ClaimAllocation `json:"claims,omitempty"`
	// Options merges the plugins' Allocate answers for the container, as
	// the kubelet hands them to the container runtime; nil without
	// devices.
	Options *RuntimeOptions `json:"options,omitempty"`
}

// Container types.
const (
	ContainerTypeInit    = "init"
	ContainerTypeSidecar = "sidecar" // an init container with restartPolicy Always
	ContainerTypeApp     = "app"
)

// RuntimeOptions is what a container runtime is told to give a container
// for its devices: the host's one type of them (devicehost.RunOptions),
// the claims' CDI devices before the device plugins'.
type RuntimeOptions = devicehost.RunOptions

// KeyValue is an environment variable or an annotation.
type KeyValue = devicehost.KeyValue

// Mount is a bind mount into the container.
type Mount = devicehost.Mount

// DeviceSpec is a device node made available in the container.
type DeviceSpec = devicehost.DeviceSpec

// Allocation is a container's devices of one resource.
type Allocation struct {
	Resource  string   `json:"resource"`
	DeviceIDs []string `json:"deviceIDs"`
	// Health is each device's health by ID, Healthy, Unhealthy or Unknown,
	// as a pod's status reports it (allocatedResourcesStatus, see
	// devicehost.DeviceManager.AllocatedResourcesStatus).
	Health map[string]string `json:"health,omitempty"`
}

// Plugins lists the plugins found through plugins_registry.
type Plugins struct {
	Registered []pluginwatcher.Plugin  `json:"registered"`
	Failing    []pluginwatcher.Failure `json:"failing,omitempty"`
}

// APIError is an error answered by the admin API.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int `json:"-"`
	// Reason is the pod admission failure reason (UnexpectedAdmissionError,
	// TopologyAffinityError), empty for other errors.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"error"`
}

func (e *APIError) Error() string {
	if e.Reason != "" {
		return e.Reason + ": " + e.Message
	}
	return e.Message
}

// IsNotFound reports whether err is an admin API 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// Client talks to the admin API of a running "dpkit kubelet".
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the admin API at socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, http: &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}},
	}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Resources lists the extended resources.
func (c *Client) Resources(ctx context.Context) ([]Resource, error) {
	var out []Resource
	return out, c.do(ctx, http.MethodGet, "/v1/resources", nil, &out)
}

// Devices lists the devices of every resource.
func (c *Client) Devices(ctx context.Context) ([]Device, error) {
	var out []Device
	return out, c.do(ctx, http.MethodGet, "/v1/devices", nil, &out)
}

// Plugins lists the plugins found through plugins_registry.
func (c *Client) Plugins(ctx context.Context) (*Plugins, error) {
	var out Plugins
	return &out, c.do(ctx, http.MethodGet, "/v1/plugins", nil, &out)
}

// Pods lists the admitted pods.
func (c *Client) Pods(ctx context.Context) ([]Pod, error) {
	var out []Pod
	return out, c.do(ctx, http.MethodGet, "/v1/pods", nil, &out)
}

// AdmitPod admits the pod in manifest (YAML or JSON) and returns it with
// its devices.
func (c *Client) AdmitPod(ctx context.Context, manifest []byte) (*Pod, error) {
	var out Pod
	return &out, c.do(ctx, http.MethodPost, "/v1/pods", manifest, &out)
}

// DeletePod removes a pod and frees its devices.
func (c *Client) DeletePod(ctx context.Context, namespace, name string) (*Pod, error) {
	var out Pod
	return &out, c.do(ctx, http.MethodDelete, "/v1/pods/"+url.PathEscape(namespace)+"/"+url.PathEscape(name), nil, &out)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://dpkit"+path, r)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("dpkit kubelet admin API at %s: %w (is \"dpkit kubelet\" or \"dpkit up\" running with this root?)", c.socket, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{StatusCode: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Message == "" {
			ae.Message = fmt.Sprintf("%s %s: %s", method, path, resp.Status)
		}
		return ae
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding %s %s: %w", method, path, err)
	}
	return nil
}
