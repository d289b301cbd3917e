// Package emulator is the emulated kubelet behind "dpkit kubelet" and
// "dpkit up": a devicehost.Host rooted at one directory, the pods it
// admitted (kept under <root>/dpkit/pods), and an admin API on a unix
// socket that "dpkit admit", "dpkit get" and "dpkit delete" use through
// Client.
package emulator

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/internal/httpserve"
	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/internal/rootlock"
	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/topology"
)

// DefaultRoot is the kubelet's root directory, where unmodified plugins
// look for kubelet.sock.
const DefaultRoot = "/var/lib/kubelet"

// Options configure an emulated kubelet.
type Options struct {
	// Root stands for the kubelet's root directory: device-plugins/,
	// plugins_registry/ and pod-resources/ are below it. Required.
	Root string
	// TopologyPolicy, TopologyScope and NUMANodes configure the device
	// manager's topology policy.
	TopologyPolicy string
	TopologyScope  string
	NUMANodes      []int
	// SysfsRoot is where sysfs is mounted: when NUMANodes is empty, the
	// machine's NUMA nodes are read below it (numa.ReadNodes), as the
	// kubelet reads them. Empty: they are not read.
	SysfsRoot string
	// AdminSocket is where the admin API is served. Default
	// AdminSocket(Root).
	AdminSocket string
	// RootLocked says that the caller holds Root's lock
	// (rootlock.Acquire); otherwise Run takes it, and fails when another
	// process holds it or another kubelet serves Root.
	RootLocked bool
	Logger     *slog.Logger
	// Claims gives the DRA manager the ResourceClaims of admitted pods
	// (dpkit kubelet --kubeconfig: ClaimsFromJSON over an API server).
	// Nil: a pod with claims is refused, saying so.
	Claims devicehost.ClaimGetter
	// Allocator allocates a pod's claims that are not allocated and
	// reserves them for the pod before they are prepared, and releases
	// them when the pod is deleted (dpkit kubelet --kubeconfig: the
	// scheduler's allocator over the API server, AllocatorFromJSON). Nil:
	// a pod's claims must be allocated and reserved for it already.
	Allocator ClaimAllocator
	// NodeName is the node this kubelet is: claims are allocated from
	// the devices published for it. Default the host's name, as the
	// kubelet's.
	NodeName string
	// AdmissionWait holds an admission while a resource the pod requests
	// is known but its plugin does not serve it yet, up to this long
	// (devicehost.Config.AdmissionWait); 0 refuses at once, as the
	// kubelet.
	AdmissionWait time.Duration
}

// Emulator is a running emulated kubelet: the host (device manager, DRA
// manager, plugin watcher, PodResources server) and the admin API over the
// pods it admitted through the host.
type Emulator struct {
	opts    Options
	log     *slog.Logger
	host    *devicehost.Host
	mgr     *devicehost.DeviceManager // host.Manager
	watcher *pluginwatcher.Watcher
	pods    *podresources.PodStore
	podsDir string
	// nodeName is Options.NodeName, or the host's name.
	nodeName string

	mu sync.Mutex // serializes admissions and deletions
}

// NUMANodes returns the machine's NUMA nodes as the device manager's
// topology policy knows them: Options.NUMANodes, or those read from sysfs.
func (e *Emulator) NUMANodes() []int { return slices.Clone(e.opts.NUMANodes) }

// Manager returns the emulator's device manager.
func (e *Emulator) Manager() *devicehost.DeviceManager { return e.mgr }

// NodeName returns the node this kubelet is (Options.NodeName, or the
// host's name).
func (e *Emulator) NodeName() string { return e.nodeName }

// Run runs an emulated kubelet until ctx is done. started, when not nil,
// is called once the device manager, the plugin watcher, the PodResources
// API and the admin API are listening. Run returns nil when ctx ends, after
// removing the sockets it served.
func Run(ctx context.Context, opts Options, started func(*Emulator)) error {
	if opts.Root == "" {
		return errors.New("root directory is required")
	}
	if opts.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("the node's name: %w; set it (--node-name)", err)
		}
		opts.NodeName = strings.ToLower(host) // as the kubelet's default
	}
	if opts.AdminSocket == "" {
		opts.AdminSocket = AdminSocket(opts.Root)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(opts.NUMANodes) == 0 && opts.SysfsRoot != "" {
		nodes, err := numa.ReadNodes(opts.SysfsRoot)
		if err != nil {
			return err
		}
		if len(nodes) == 0 && opts.TopologyPolicy != "" && opts.TopologyPolicy != topology.PolicyNone {
			return fmt.Errorf("topology policy %s needs the machine's NUMA nodes, and %s lists none; give them with --numa-nodes, e.g. --numa-nodes 0",
				opts.TopologyPolicy, filepath.Join(opts.SysfsRoot, numa.NodesDir))
		}
		opts.NUMANodes = nodes
	}
	if !opts.RootLocked {
		lock, err := rootlock.Acquire(opts.Root)
		if err != nil {
			return err
		}
		defer func() { _ = lock.Release() }()
	}
	host, err := devicehost.New(devicehost.Config{
		Root:           opts.Root,
		Logger:         log,
		TopologyPolicy: opts.TopologyPolicy,
		TopologyScope:  opts.TopologyScope,
		NUMANodes:      opts.NUMANodes,
		Claims:         opts.Claims,
		AdmissionWait:  opts.AdmissionWait,
	})
	if err != nil {
		return err
	}
	mgr := host.Manager
	// The host's components name themselves (component=devicemanager,
	// ...); the emulator's own lines say component=emulator.
	log = log.With("component", "emulator")
	e := &Emulator{opts: opts, log: log, host: host, mgr: mgr, pods: host.Pods, podsDir: filepath.Join(opts.Root, "dpkit", "pods"), nodeName: opts.NodeName}
	if err := e.loadPods(); err != nil {
		return err
	}
	// The host stops with the first of its components or the admin API to
	// fail, and with ctx.
	g, gctx := errgroup.WithContext(ctx)
	// Allocations restored from the checkpoint for pods this emulator no
	// longer knows are dropped, as the kubelet does for inactive pods.
	if err := host.Start(gctx, host.Pods.UIDs()); err != nil {
		return err
	}
	defer host.Stop()
	e.watcher = host.Watcher
	admin, err := listenUnix(opts.AdminSocket, "admin socket", "choose another --admin-socket")
	if err != nil {
		return err
	}
	g.Go(func() error {
		<-host.Done()
		return host.Err()
	})
	g.Go(func() error { return e.serveAdmin(gctx, admin) })
	if started != nil {
		started(e)
	}
	log.Info("Emulated kubelet running", "root", opts.Root, "registration", mgr.SocketPath(),
		"podResources", podresources.SocketPath(opts.Root), "admin", opts.AdminSocket,
		"topologyPolicy", cmp.Or(opts.TopologyPolicy, topology.PolicyNone), "numaNodes", opts.NUMANodes)
	return g.Wait()
}

// listenUnix listens on socket, replacing a stale socket there. what
// names the socket and fix says how to choose another, for errors.
func listenUnix(socket, what, fix string) (net.Listener, error) {
	l, err := unixsock.Listen(socket)
	if errors.Is(err, unixsock.ErrNotSocket) {
		return nil, fmt.Errorf("%s %s exists and is not a socket; remove it or %s", what, socket, fix)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return l, nil
}

func (e *Emulator) serveAdmin(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/resources", e.getResources)
	mux.HandleFunc("GET /v1/devices", e.getDevices)
	mux.HandleFunc("GET /v1/plugins", e.getPlugins)
	mux.HandleFunc("GET /v1/pods", e.getPods)
	mux.HandleFunc("POST /v1/pods", e.admitPod)
	mux.HandleFunc("DELETE /v1/pods/{namespace}/{name}", e.deletePod)
	if err := httpserve.Serve(ctx, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, l); err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, reason string, err error) {
	writeJSON(w, code, &APIError{Reason: reason, Message: err.Error()})
}

func (e *Emulator) getResources(w http.ResponseWriter, _ *http.Request) {
	out := []Resource{}
	for _, r := range e.mgr.Resources() {
		out = append(out, Resource{Name: r.Name, Capacity: r.Capacity, Allocatable: r.Allocatable, InUse: r.InUse, Connected: r.Connected})
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) getDevices(w http.ResponseWriter, _ *http.Request) {
	names := map[string]string{}
	for _, p := range e.pods.GetActivePods() {
		names[string(p.UID)] = p.Namespace + "/" + p.Name
	}
	out := []Device{}
	for _, r := range e.mgr.Resources() {
		for _, d := range e.mgr.Devices(r.Name) {
			out = append(out, Device{Resource: r.Name, ID: d.ID, Healthy: d.Healthy, NUMANodes: d.NUMANodes, PodUID: d.PodUID, Pod: names[d.PodUID]})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) getPlugins(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &Plugins{Registered: e.watcher.Plugins(), Failing: e.watcher.Failures()})
}

func (e *Emulator) getPods(w http.ResponseWriter, _ *http.Request) {
	out := []Pod{}
	for _, p := range e.pods.GetActivePods() {
		out = append(out, e.podView(p))
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) podView(p *corev1.Pod) Pod {
	v := Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
	a := e.mgr.PodAllocation(p.UID)
	health := e.mgr.AllocatedResourcesStatus(p.UID)
	add := func(name, typ string) {
		c := Container{Name: name, Type: typ}
		if a != nil {
			for _, ca := range a.Containers {
				if ca.Name != name {
					continue
				}
				for _, ra := range ca.Resources {
					al := Allocation{Resource: ra.Resource, DeviceIDs: ra.DeviceIDs}
					for _, rs := range health[name] {
						if string(rs.Name) != ra.Resource {
							continue
						}
						al.Health = make(map[string]string, len(rs.Resources))
						for _, h := range rs.Resources {
							al.Health[string(h.ResourceID)] = string(h.Health)
						}
					}
					c.Devices = append(c.Devices, al)
				}
			}
		}
		opts, err := e.host.ContainerResources(p, name)
		if err != nil {
			e.log.Warn("Cannot read a container's runtime options", "namespace", p.Namespace, "name", p.Name, "container", name, "err", err)
		}
		c.Options = opts
		c.Claims = e.claims(p, name)
		v.Containers = append(v.Containers, c)
	}
	for _, c := range p.Spec.InitContainers {
		typ := ContainerTypeInit
		if podspec.IsSidecar(&c) {
			typ = ContainerTypeSidecar
		}
		add(c.Name, typ)
	}
	for _, c := range p.Spec.Containers {
		add(c.Name, ContainerTypeApp)
	}
	return v
}

func (e *Emulator) admitPod(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "", err)
		return
	}
	pod, err := DecodePod(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, "", err)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.pods.GetPodByName(pod.Namespace, pod.Name); ok {
		writeError(w, http.StatusConflict, "", fmt.Errorf("pod %s/%s already exists; delete it first", pod.Namespace, pod.Name))
		return
	}
	for _, other := range e.pods.GetActivePods() {
		if other.UID == pod.UID {
			writeError(w, http.StatusConflict, "", fmt.Errorf("metadata.uid: pod %s/%s already has UID %s; give each pod its own UID, or omit it to get a generated one", other.Namespace, other.Name, pod.UID))
			return
		}
	}
	// In the pod store while admitted, as in a kubelet's pod manager: the
	// DRA manager unprepares the claims of pods that are not active.
	e.pods.Add(pod)
	if err := e.admit(r.Context(), pod); err != nil {
		e.pods.Remove(pod.UID)
		var ae *devicehost.AdmissionError
		var pe *devicehost.PrepareError
		switch {
		case errors.As(err, &ae):
			writeError(w, http.StatusUnprocessableEntity, ae.Reason, errors.New(ae.PodMessage()))
		case errors.As(err, &pe):
			writeError(w, http.StatusUnprocessableEntity, devicehost.FailedPrepareDynamicResources, pe.Err)
		default:
			writeError(w, http.StatusInternalServerError, "", err)
		}
		return
	}
	if err := e.savePod(pod); err != nil {
		e.pods.Remove(pod.UID)
		e.rollBack(pod, e.host.RollBackPod(pod))
		writeError(w, http.StatusInternalServerError, "", err)
		return
	}
	view := e.podView(pod)
	view.Warnings = unserved(pod, e.mgr.Resources())
	e.log.Info("Pod admitted", "namespace", pod.Namespace, "name", pod.Name, "uid", pod.UID, "warnings", len(view.Warnings))
	writeJSON(w, http.StatusCreated, view)
}

func (e *Emulator) deletePod(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	e.mu.Lock()
	defer e.mu.Unlock()
	pod, ok := e.pods.GetPodByName(ns, name)
	if !ok {
		writeError(w, http.StatusNotFound, "", fmt.Errorf("pod %s in namespace %s not found", name, ns))
		return
	}
	view := e.podView(pod)
	if err := e.host.ReleasePod(r.Context(), pod); err != nil {
		writeError(w, http.StatusInternalServerError, "", fmt.Errorf("%w; the pod is kept with its claims, run dpkit delete again once the driver answers", err))
		return
	}
	if err := e.releaseClaims(r.Context(), pod); err != nil {
		writeError(w, http.StatusInternalServerError, "", fmt.Errorf("%w; the pod is kept, run dpkit delete again once the API server answers", err))
		return
	}
	if err := os.Remove(filepath.Join(e.podsDir, string(pod.UID)+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusInternalServerError, "", err)
		return
	}
	e.pods.Remove(pod.UID)
	e.log.Info("Pod deleted", "namespace", ns, "name", name, "uid", pod.UID)
	writeJSON(w, http.StatusOK, view)
}

// DecodePod decodes a pod manifest (one YAML or JSON document) strictly,
// applies defaults (namespace "default", a generated UID) and checks what
// the device manager relies on and the API server would check, reporting
// every problem with its field path.
func DecodePod(data []byte) (*corev1.Pod, error) {
	data, err := singleDocument(data)
	if err != nil {
		return nil, err
	}
	// Decoded like the API server decodes: case-sensitive field names,
	// unknown and duplicate fields are errors naming their path.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("decoding pod manifest: %w", cleanDecodeError(err))
	}
	pod := &corev1.Pod{}
	strict, err := sigsjson.UnmarshalStrict(js, pod)
	if err != nil {
		return nil, fmt.Errorf("decoding pod manifest: %w", cleanDecodeError(err))
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("decoding pod manifest: %w", errors.Join(strict...))
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("kind: %q is not Pod", pod.Kind)
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	if pod.UID == "" {
		pod.UID = uuid.NewUUID()
	}
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	// The UID names the pod's files under the emulator's root: it must be
	// a plain name, never a path.
	if !validUID(string(pod.UID)) {
		errs = append(errs, field.Invalid(meta.Child("uid"), string(pod.UID),
			"must be 1-128 letters, digits, '-', '_' or '.', starting with a letter or digit (a UUID, say); omit it to get a generated one"))
	}
	if pod.Name == "" {
		errs = append(errs, field.Required(meta.Child("name"), "name the pod"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(pod.Name) {
		if pod.Name != "" {
			errs = append(errs, field.Invalid(meta.Child("name"), pod.Name, msg))
		}
	}
	for _, msg := range validation.IsDNS1123Label(pod.Namespace) {
		errs = append(errs, field.Invalid(meta.Child("namespace"), pod.Namespace, msg))
	}
	spec := field.NewPath("spec")
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(spec.Child("containers"), "a pod needs at least one container"))
	}
	seen := map[string]bool{}
	check := func(p *field.Path, cs []corev1.Container) {
		for i, c := range cs {
			switch {
			case c.Name == "":
				errs = append(errs, field.Required(p.Index(i).Child("name"), "name the container"))
			case seen[c.Name]:
				errs = append(errs, field.Duplicate(p.Index(i).Child("name"), c.Name))
			}
			seen[c.Name] = true
			errs = append(errs, checkContainerResources(p.Index(i).Child("resources"), c.Resources)...)
		}
	}
	check(spec.Child("initContainers"), pod.Spec.InitContainers)
	check(spec.Child("containers"), pod.Spec.Containers)
	if pod.Spec.Resources != nil {
		errs = append(errs, checkPodResources(spec.Child("resources"), *pod.Spec.Resources)...)
	}
	if len(errs) > 0 {
		return nil, &InvalidPodError{Errs: errs}
	}
	return pod, nil
}

// InvalidPodError lists every problem of a pod manifest, one per line,
// each with its field path.
type InvalidPodError struct{ Errs field.ErrorList }

func (e *InvalidPodError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid pod, %d problem(s):", len(e.Errs))
	for _, fe := range e.Errs {
		b.WriteString("\n  - ")
		b.WriteString(fe.Error())
	}
	return b.String()
}

// Unwrap returns the field errors.
func (e *InvalidPodError) Unwrap() []error {
	out := make([]error, len(e.Errs))
	for i, fe := range e.Errs {
		out[i] = fe
	}
	return out
}

// validUID reports whether uid is safe to use as a file name: 1-128
// letters, digits, '-', '_' or '.', starting with a letter or digit.
func validUID(uid string) bool {
	if uid == "" || len(uid) > 128 {
		return false
	}
	for i, c := range uid {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || (c != '-' && c != '_' && c != '.')) {
			return false
		}
	}
	return true
}

// singleDocument returns the one YAML document in data that is not empty
// or comments only, and an error when there are several.
func singleDocument(data []byte) ([]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading pod manifest: %w", err)
		}
		var v any
		if yaml.Unmarshal(doc, &v) == nil && v == nil {
			continue
		}
		docs = append(docs, doc)
	}
	switch len(docs) {
	case 0:
		return data, nil
	case 1:
		return docs[0], nil
	default:
		return nil, fmt.Errorf("the pod manifest holds %d YAML documents; give one Pod per manifest", len(docs))
	}
}

// cleanDecodeError drops the decoder's layered prefixes, so that
// `error unmarshaling JSON: while decoding JSON: json: unknown field "x"`
// reads `unknown field "x"`.
func cleanDecodeError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return errors.New(msg)
}

func (e *Emulator) savePod(pod *corev1.Pod) error {
	if err := os.MkdirAll(e.podsDir, 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	path := filepath.Join(e.podsDir, string(pod.UID)+".json")
	return fileutil.WriteAtomic(path, data, 0o600)
}

func (e *Emulator) loadPods() error {
	entries, err := os.ReadDir(e.podsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading admitted pods: %w", err)
	}
	for _, ent := range entries {
		if ent.IsDir() || !strings.HasSuffix(ent.Name(), ".json") {
			continue
		}
		path := filepath.Join(e.podsDir, ent.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading admitted pod: %w", err)
		}
		pod := &corev1.Pod{}
		if err := json.Unmarshal(data, pod); err != nil || pod.UID != types.UID(strings.TrimSuffix(ent.Name(), ".json")) {
			e.log.Warn("Ignoring an unreadable admitted pod file", "path", path, "err", err)
			continue
		}
		e.pods.Add(pod)
	}
	return nil
}
