package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// The kubelet's volume plugin directories under a pod's volumes/.
const (
	pluginEmptyDir    = "kubernetes.io~empty-dir"
	pluginConfigMap   = "kubernetes.io~configmap"
	pluginSecret      = "kubernetes.io~secret"
	pluginDownwardAPI = "kubernetes.io~downward-api"
	pluginProjected   = "kubernetes.io~projected"

	// defaultVolumeMode is the API's default mode of configMap, secret,
	// downwardAPI and projected files.
	defaultVolumeMode = 0o644

	firstMountRetry = 500 * time.Millisecond
	maxMountRetry   = 2*time.Minute + 2*time.Second // the kubelet's exponential back-off cap
)

// hostVolume is a volume as containers mount it.
type hostVolume struct {
	path string
	// readOnly: configMap, secret, downwardAPI and projected volumes are
	// mounted read-only whatever the volumeMount says, as by the kubelet
	// (their mounters' ReadOnly attribute).
	readOnly bool
}

// Source reads what a pod's volumes show, authorized as the node (a
// backend.VolumeSource). Errors about objects that do not exist satisfy
// apierrors.IsNotFound.
type Source interface {
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	ServiceAccountToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// Config configures a pod's Manager.
type Config struct {
	// Dir is the pod's directory, as the kubelet's pods/<uid>: volumes
	// go to volumes/<plugin>/<name> below it, subPaths to
	// volume-subpaths/.
	Dir string
	// Source reads ConfigMaps and Secrets and issues tokens; without one
	// such volumes fail to mount.
	Source Source
	// Event records an event about the pod (FailedMount). May be nil.
	Event func(eventType, reason, message string)
	// NodeAllocatable sizes memory-backed volumes. May be nil.
	NodeAllocatable func() corev1.ResourceList
	// DiskBacked writes secret, projected and downwardAPI volumes and
	// emptyDir{medium: Memory} to plain directories instead of a tmpfs
	// each (which needs the privilege to mount).
	DiskBacked bool
	// Resync is how often ConfigMap, Secret, downward API and token
	// contents are written again (the kubelet's sync period). Default a
	// minute.
	Resync time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultResync is the kubelet's sync period.
const DefaultResync = time.Minute

// Manager sets up and keeps up one pod's volumes, as the kubelet's
// volume manager does for it, and gives each container its mounts. It is
// used by one goroutine, the pod worker's.
type Manager struct {
	cfg Config
	pod *corev1.Pod
	log *slog.Logger

	mounted map[string]hostVolume // nil until every volume is set up
	synced  time.Time
	failed  string // the last FailedMount message
	retryAt time.Time
	retry   time.Duration
	tokens  map[string]*authenticationv1.TokenRequest // volume/path -> the token written
	ready   map[string]bool                           // emptyDirs set up (mode, fsGroup)
}

// New returns the volume manager of pod.
func New(pod *corev1.Pod, cfg Config) *Manager {
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, pod: pod, log: log}
}

func (m *Manager) key() string { return m.pod.Namespace + "/" + m.pod.Name }

// subPathDir is where, below a pod's directory, its subPaths are
// bind-mounted for the runtime (the kubelet's volume-subpaths).
const subPathDir = "volume-subpaths"

func (m *Manager) volumeDir(plugin, name string) string {
	return filepath.Join(m.cfg.Dir, "volumes", plugin, name)
}

// Sync sets up the pod's volumes before its sandbox, as the
// kubelet waits for them to be mounted (WaitForAttachAndMount), and
// rewrites the ConfigMap, Secret, downward API and token contents every
// Config.Resync so that running containers see updates. It reports
// whether the containers may start.
func (m *Manager) Sync(ctx context.Context) bool {
	now := time.Now()
	if m.mounted != nil && now.Sub(m.synced) < m.cfg.Resync {
		return true
	}
	if now.Before(m.retryAt) {
		return m.mounted != nil
	}
	mounted, err := m.setupVolumes(ctx)
	if err == nil {
		m.mounted, m.synced, m.failed, m.retry = mounted, now, "", 0
		return true
	}
	// As the kubelet: the failure is an event on the pod, retried with
	// an exponential back-off; a volume that was set up keeps what it
	// showed.
	m.retry = min(max(2*m.retry, firstMountRetry), maxMountRetry)
	m.retryAt = now.Add(m.retry)
	if msg := err.Error(); msg != m.failed {
		m.failed = msg
		m.podEvent(corev1.EventTypeWarning, podruntime.EventFailedMount, msg)
	}
	m.log.Warn("Setting up a volume", "pod", m.key(), "err", err)
	return m.mounted != nil
}

// podEvent records an event about the pod itself.
func (m *Manager) podEvent(eventType, reason, message string) {
	if m.cfg.Event != nil {
		m.cfg.Event(eventType, reason, message)
	}
}

func (m *Manager) setupVolumes(ctx context.Context) (map[string]hostVolume, error) {
	out := map[string]hostVolume{}
	for _, vol := range m.pod.Spec.Volumes {
		hv, err := m.setupVolume(ctx, vol)
		if err != nil {
			return nil, podruntime.MountFailedError(vol.Name, err)
		}
		out[vol.Name] = hv
	}
	return out, nil
}

func (m *Manager) setupVolume(ctx context.Context, vol corev1.Volume) (hostVolume, error) {
	src := vol.VolumeSource
	switch {
	case src.EmptyDir != nil:
		dir := m.volumeDir(pluginEmptyDir, vol.Name)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return hostVolume{}, err
		}
		if src.EmptyDir.Medium == corev1.StorageMediumMemory {
			if err := m.memoryBacked(dir, src.EmptyDir.SizeLimit); err != nil {
				return hostVolume{}, err
			}
		}
		if m.ready[vol.Name] {
			// Set up before: as the kubelet's emptyDir (its ready
			// marker), not walked again while the pod writes it.
			return hostVolume{path: dir}, nil
		}
		if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // the kubelet's mode for emptyDir
			return hostVolume{}, err
		}
		if err := m.setOwnership(dir, false); err != nil {
			return hostVolume{}, err
		}
		if m.ready == nil {
			m.ready = map[string]bool{}
		}
		m.ready[vol.Name] = true
		return hostVolume{path: dir}, nil
	case src.HostPath != nil:
		return hostVolume{path: src.HostPath.Path}, checkHostPathType(src.HostPath.Path, src.HostPath.Type)
	case src.ConfigMap != nil:
		payload, err := m.configMapPayload(ctx, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.DefaultMode, src.ConfigMap.Optional)
		return m.writeVolume(pluginConfigMap, vol.Name, payload, err)
	case src.Secret != nil:
		payload, err := m.secretPayload(ctx, src.Secret.SecretName, src.Secret.Items, src.Secret.DefaultMode, src.Secret.Optional)
		return m.writeMemoryVolume(pluginSecret, vol.Name, payload, err)
	case src.DownwardAPI != nil:
		payload, err := m.downwardAPIPayload(src.DownwardAPI.Items, src.DownwardAPI.DefaultMode)
		return m.writeMemoryVolume(pluginDownwardAPI, vol.Name, payload, err)
	case src.Projected != nil:
		payload, err := m.projectedPayload(ctx, vol.Name, src.Projected)
		return m.writeMemoryVolume(pluginProjected, vol.Name, payload, err)
	}
	return hostVolume{}, errors.New("dpkit node sets up emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes only")
}

// writeMemoryVolume is writeVolume on a tmpfs: the kubelet backs secret,
// projected and downwardAPI volumes with memory (their wrapped
// emptyDir{medium: Memory}), so that Secrets and tokens never reach the
// node's disk.
func (m *Manager) writeMemoryVolume(plugin, name string, payload map[string]file, err error) (hostVolume, error) {
	if err != nil {
		return hostVolume{}, err
	}
	if err := m.memoryBacked(m.volumeDir(plugin, name), nil); err != nil {
		return hostVolume{}, err
	}
	return m.writeVolume(plugin, name, payload, nil)
}

// memoryBacked mounts a tmpfs at dir, unless Config.DiskBacked.
func (m *Manager) memoryBacked(dir string, sizeLimit *resource.Quantity) error {
	if m.cfg.DiskBacked {
		return os.MkdirAll(dir, 0o750)
	}
	var alloc corev1.ResourceList
	if m.cfg.NodeAllocatable != nil {
		alloc = m.cfg.NodeAllocatable()
	}
	return mountTmpfs(dir, tmpfsSize(m.pod, alloc, sizeLimit))
}

// tmpfsSize is the kubelet's calculateEmptyDirMemorySize: the node's
// allocatable memory, or the pod's memory limit when it has one and it
// is smaller, or the volume's sizeLimit when smaller still; 0 (the
// kernel's default, half the memory) when the node declares none.
func tmpfsSize(pod *corev1.Pod, alloc corev1.ResourceList, sizeLimit *resource.Quantity) int64 {
	size := alloc.Memory().Value()
	if size <= 0 {
		return 0
	}
	if l, ok := podMemoryLimit(pod); ok && l > 0 && l <= size {
		size = l
	}
	if sizeLimit != nil && sizeLimit.Value() > 0 && sizeLimit.Value() <= size {
		size = sizeLimit.Value()
	}
	return size
}

// podMemoryLimit is the pod's memory limit as the kubelet sets its cgroup
// (ResourceConfigForPod): the app and sidecar containers' limits added,
// or a regular init container's with the sidecars started before it
// when that is more, plus the pod's overhead; none unless every
// container has a limit.
func podMemoryLimit(pod *corev1.Pod) (int64, bool) {
	var sidecars, initMax int64
	for _, c := range pod.Spec.InitContainers {
		q, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			return 0, false
		}
		if podspec.IsSidecar(&c) {
			sidecars += q.Value()
			continue
		}
		initMax = max(initMax, sidecars+q.Value())
	}
	total := sidecars
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			return 0, false
		}
		total += q.Value()
	}
	return max(total, initMax) + pod.Spec.Overhead.Memory().Value(), true
}

func (m *Manager) writeVolume(plugin, name string, payload map[string]file, err error) (hostVolume, error) {
	if err != nil {
		return hostVolume{}, err
	}
	dir := m.volumeDir(plugin, name)
	if err := writeAtomic(dir, payload); err != nil {
		return hostVolume{}, fmt.Errorf("writing the volume's files: %w", err)
	}
	return hostVolume{path: dir, readOnly: true}, m.setOwnership(dir, true)
}

// The kubelet's SetVolumeOwnership masks.
const (
	rwMask   = 0o660
	roMask   = 0o440
	execMask = 0o110
)

// setOwnership is the kubelet's SetVolumeOwnership for a pod with an
// fsGroup: everything in the volume gets the group, and group read (and
// write, unless the volume is read-only) permission; directories also
// setgid and group search. Links only change group, and none is followed
// (groupTree).
func (m *Manager) setOwnership(dir string, readOnly bool) error {
	psc := m.pod.Spec.SecurityContext
	if psc == nil || psc.FSGroup == nil {
		return nil
	}
	mask := fs.FileMode(rwMask)
	if readOnly {
		mask = roMask
	}
	if err := groupTree(dir, int(*psc.FSGroup), mask); err != nil {
		return fmt.Errorf("setting the volume's group (fsGroup): %w", err)
	}
	return nil
}

func mode(m *int32, def *int32) fs.FileMode {
	switch {
	case m != nil:
		return fs.FileMode(*m) //nolint:gosec // validated by the API server: 0..0777
	case def != nil:
		return fs.FileMode(*def) //nolint:gosec // as above
	}
	return defaultVolumeMode
}

func (m *Manager) volumeSource() (Source, error) {
	if m.cfg.Source == nil {
		return nil, errors.New("the node reads no ConfigMaps, Secrets or tokens (backend.Config.Volumes is nil)")
	}
	return m.cfg.Source, nil
}

// configMapPayload is the kubelet's configmap.MakePayload: every key, or
// the items asked for; a missing key fails unless optional.
func (m *Manager) configMapPayload(ctx context.Context, name string, items []corev1.KeyToPath, defMode *int32, optional *bool) (map[string]file, error) {
	src, err := m.volumeSource()
	if err != nil {
		return nil, err
	}
	opt := optional != nil && *optional
	cm, err := readOptional(ctx, src.ConfigMap, m.pod.Namespace, name, opt)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyPayload(data, items, defMode, opt, "configmap references non-existent config key: %s")
}

// secretPayload is the kubelet's secret.MakePayload.
func (m *Manager) secretPayload(ctx context.Context, name string, items []corev1.KeyToPath, defMode *int32, optional *bool) (map[string]file, error) {
	src, err := m.volumeSource()
	if err != nil {
		return nil, err
	}
	opt := optional != nil && *optional
	s, err := readOptional(ctx, src.Secret, m.pod.Namespace, name, opt)
	if err != nil {
		return nil, err
	}
	return keyPayload(s.Data, items, defMode, opt, "references non-existent secret key: %s")
}

// readOptional reads the object a volume names with get; one that does
// not exist reads as empty when the volume is optional.
func readOptional[T any](ctx context.Context, get func(ctx context.Context, namespace, name string) (*T, error), namespace, name string, optional bool) (*T, error) {
	o, err := get(ctx, namespace, name)
	if err != nil {
		if !apierrors.IsNotFound(err) || !optional {
			return nil, err
		}
		return new(T), nil
	}
	return o, nil
}

func keyPayload(data map[string][]byte, items []corev1.KeyToPath, defMode *int32, optional bool, missing string) (map[string]file, error) {
	payload := map[string]file{}
	if len(items) == 0 {
		for k, v := range data {
			payload[k] = file{data: v, mode: mode(nil, defMode)}
		}
		return payload, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf(missing, it.Key)
		}
		payload[it.Path] = file{data: v, mode: mode(it.Mode, defMode)}
	}
	return payload, nil
}

// downwardAPIPayload is the kubelet's downwardapi.CollectData.
func (m *Manager) downwardAPIPayload(items []corev1.DownwardAPIVolumeFile, defMode *int32) (map[string]file, error) {
	payload := map[string]file{}
	var errs []error
	for _, it := range items {
		var value string
		var err error
		switch {
		case it.FieldRef != nil:
			value, err = fieldValue(m.pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			var alloc corev1.ResourceList
			if m.cfg.NodeAllocatable != nil {
				alloc = m.cfg.NodeAllocatable()
			}
			value, err = resourceValue(m.pod, it.ResourceFieldRef, alloc)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		payload[filepath.Clean(it.Path)] = file{data: []byte(value), mode: mode(it.Mode, defMode)}
	}
	return payload, errors.Join(errs...)
}

// fieldValue is fieldpath.ExtractFieldPathAsString for the fields a
// downwardAPI volume may name.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	if sub, key, ok := subscript(path); ok {
		switch sub {
		case "metadata.labels":
			return pod.Labels[key], nil
		case "metadata.annotations":
			return pod.Annotations[key], nil
		}
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	return "", fmt.Errorf("unsupported fieldPath: %v", path)
}

// subscript splits "metadata.labels['key']".
func subscript(path string) (string, string, bool) {
	i := strings.Index(path, "['")
	if i < 0 || !strings.HasSuffix(path, "']") {
		return "", "", false
	}
	return path[:i], path[i+2 : len(path)-2], true
}

// formatMap is fieldpath.FormatMap: key="value" lines, sorted by key.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%v=%q", k, m[k])
	}
	return b.String()
}

// resourceValue is the kubelet's ExtractContainerResourceValue for the
// container the reference names, rounded up in units of the divisor; an
// unset CPU, memory or ephemeral storage limit reads as the node's
// allocatable, as the kubelet merges them.
func resourceValue(pod *corev1.Pod, ref *corev1.ResourceFieldSelector, alloc corev1.ResourceList) (string, error) {
	var c *corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == ref.ContainerName {
				c = &list[i]
			}
		}
	}
	if c == nil {
		return "", fmt.Errorf("container %s not found", ref.ContainerName)
	}
	divisor := resource.MustParse("1")
	if !ref.Divisor.IsZero() {
		divisor = ref.Divisor
	}
	kind, name, _ := strings.Cut(ref.Resource, ".")
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	} else if kind != "limits" {
		return "", fmt.Errorf("unsupported container resource : %v", ref.Resource)
	}
	q, set := list[corev1.ResourceName(name)]
	if rn := corev1.ResourceName(name); kind == "limits" && !set && (rn == corev1.ResourceCPU || rn == corev1.ResourceMemory || rn == corev1.ResourceEphemeralStorage) {
		q = alloc[rn]
	}
	if name == "cpu" {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

// projectedPayload is the kubelet's projected collectData: the sources'
// files together; a service account token comes from the TokenRequest
// API, bound to the pod, and is asked for again once 80% of its lifetime
// has passed or it is a day old (the kubelet's token manager).
func (m *Manager) projectedPayload(ctx context.Context, volName string, p *corev1.ProjectedVolumeSource) (map[string]file, error) {
	payload := map[string]file{}
	var errs []error
	add := func(part map[string]file, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for k, v := range part {
			payload[k] = v
		}
	}
	for _, s := range p.Sources {
		switch {
		case s.ConfigMap != nil:
			add(m.configMapPayload(ctx, s.ConfigMap.Name, s.ConfigMap.Items, p.DefaultMode, s.ConfigMap.Optional))
		case s.Secret != nil:
			add(m.secretPayload(ctx, s.Secret.Name, s.Secret.Items, p.DefaultMode, s.Secret.Optional))
		case s.DownwardAPI != nil:
			add(m.downwardAPIPayload(s.DownwardAPI.Items, p.DefaultMode))
		case s.ServiceAccountToken != nil:
			tok, err := m.token(ctx, volName, s.ServiceAccountToken)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// As the kubelet: with an fsGroup the token is for the
			// owner, and the group gets read access from setOwnership.
			fm := mode(nil, p.DefaultMode)
			if psc := m.pod.Spec.SecurityContext; psc != nil && psc.FSGroup != nil {
				fm = 0o600
			}
			payload[s.ServiceAccountToken.Path] = file{data: []byte(tok), mode: fm}
		default:
			errs = append(errs, errors.New("dpkit node projects configMap, secret, downwardAPI and serviceAccountToken sources only"))
		}
	}
	return payload, errors.Join(errs...)
}

func (m *Manager) token(ctx context.Context, volName string, tp *corev1.ServiceAccountTokenProjection) (string, error) {
	key := volName + "/" + tp.Path
	if tr := m.tokens[key]; tr != nil && !tokenNeedsRefresh(tr, time.Now()) {
		return tr.Status.Token, nil
	}
	src, err := m.volumeSource()
	if err != nil {
		return "", err
	}
	var auds []string
	if tp.Audience != "" {
		auds = []string{tp.Audience}
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: auds, ExpirationSeconds: tp.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: m.pod.Name, UID: m.pod.UID},
	}}
	tr, err := src.ServiceAccountToken(ctx, m.pod.Namespace, m.pod.Spec.ServiceAccountName, req)
	if err != nil {
		return "", err
	}
	if m.tokens == nil {
		m.tokens = map[string]*authenticationv1.TokenRequest{}
	}
	if tr.Spec.ExpirationSeconds == nil {
		tr.Spec.ExpirationSeconds = tp.ExpirationSeconds
	}
	m.tokens[key] = tr
	return tr.Status.Token, nil
}

// tokenNeedsRefresh is the token manager's requiresRefresh, less its
// jitter: past 80% of the lifetime, or older than 24h.
func tokenNeedsRefresh(tr *authenticationv1.TokenRequest, now time.Time) bool {
	exp := tr.Status.ExpirationTimestamp.Time
	if tr.Spec.ExpirationSeconds == nil || now.After(exp) {
		return true
	}
	ttl := time.Duration(*tr.Spec.ExpirationSeconds) * time.Second
	if now.After(exp.Add(-ttl).Add(24 * time.Hour)) {
		return true
	}
	return now.After(exp.Add(-ttl / 5))
}

// checkHostPathType is the kubelet's hostPath type check: the
// ...OrCreate types create a missing directory (0755) or empty file
// (0644); the others must find what they name.
func checkHostPathType(path string, t *corev1.HostPathType) error {
	if t == nil || *t == corev1.HostPathUnset {
		return nil
	}
	st, statErr := os.Stat(path)
	exists := statErr == nil
	is := func(m fs.FileMode) bool { return exists && st.Mode().Type() == m }
	switch *t {
	case corev1.HostPathDirectoryOrCreate:
		if !exists {
			return os.MkdirAll(path, 0o755) //nolint:gosec // the kubelet's mode
		}
		fallthrough
	case corev1.HostPathDirectory:
		if !exists || !st.IsDir() {
			return fmt.Errorf("hostPath type check failed: %s is not a directory", path)
		}
	case corev1.HostPathFileOrCreate:
		if !exists {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644) //nolint:gosec // the kubelet's mode
			if err != nil {
				return err
			}
			return f.Close()
		}
		fallthrough
	case corev1.HostPathFile:
		if !exists || !st.Mode().IsRegular() {
			return fmt.Errorf("hostPath type check failed: %s is not a file", path)
		}
	case corev1.HostPathSocket:
		if !is(fs.ModeSocket) {
			return fmt.Errorf("hostPath type check failed: %s is not a socket file", path)
		}
	case corev1.HostPathCharDev:
		if !is(fs.ModeDevice | fs.ModeCharDevice) {
			return fmt.Errorf("hostPath type check failed: %s is not a character device", path)
		}
	case corev1.HostPathBlockDev:
		if !is(fs.ModeDevice) {
			return fmt.Errorf("hostPath type check failed: %s is not a block device", path)
		}
	default:
		return fmt.Errorf("%s is an invalid volume type", *t)
	}
	return nil
}

// Mount is a container's mount of a pod's volume.
type Mount struct {
	ContainerPath, HostPath string
	ReadOnly                bool
	// Propagation is the mount's, validated: None, HostToContainer or
	// Bidirectional.
	Propagation corev1.MountPropagationMode
}

// Mounts are the container's mounts of the pod's volumes, as the
// kubelet's makeMounts makes them: subPath (and subPathExpr, expanded
// from the container's environment vars) within the volume, created as
// a directory when missing; read-only when the mount or the volume is;
// mountPropagation checked (Bidirectional for a privileged container
// only). Call it once Sync reported the volumes ready.
func (m *Manager) Mounts(spec *corev1.Container, vars map[string]string) ([]Mount, error) {
	var out []Mount
	for i, vm := range spec.VolumeMounts {
		hv, ok := m.mounted[vm.Name]
		if !ok {
			return nil, fmt.Errorf("cannot find volume %q to mount into container %q", vm.Name, spec.Name)
		}
		host := hv.path
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = podruntime.Expand(vm.SubPathExpr, vars)
		}
		if sub != "" {
			if err := validatePath(filepath.Clean(sub)); err != nil || filepath.IsAbs(sub) {
				return nil, fmt.Errorf("subPath %q of volume %q: must be a relative path within the volume", sub, vm.Name)
			}
			// As the kubelet: the subPath is opened without following a
			// link out of the volume (a link another container of the
			// pod planted), its missing directories made with the
			// volume's mode, and the opened inode bind-mounted where the
			// runtime is pointed (CVE-2017-1002101, CVE-2021-25741).
			perm := fs.FileMode(0o755)
			if st, err := os.Stat(hv.path); err == nil {
				perm = st.Mode().Perm()
			}
			fd, err := openSubPath(hv.path, sub, perm)
			if err != nil {
				return nil, fmt.Errorf("failed to prepare subPath for volumeMount %q of container %q: %w", vm.Name, spec.Name, err)
			}
			host = filepath.Join(m.cfg.Dir, subPathDir, vm.Name, spec.Name, strconv.Itoa(i))
			err = bindSubPath(fd, host)
			_ = syscall.Close(fd)
			if err != nil {
				return nil, fmt.Errorf("failed to prepare subPath for volumeMount %q of container %q: %w", vm.Name, spec.Name, err)
			}
		}
		prop, err := propagation(vm.MountPropagation, spec)
		if err != nil {
			return nil, err
		}
		out = append(out, Mount{ContainerPath: vm.MountPath, HostPath: host, ReadOnly: vm.ReadOnly || hv.readOnly, Propagation: prop})
	}
	return out, nil
}

// propagation is the kubelet's check of mountPropagation; only a
// privileged container may ask for Bidirectional.
func propagation(p *corev1.MountPropagationMode, c *corev1.Container) (corev1.MountPropagationMode, error) {
	if p == nil {
		return corev1.MountPropagationNone, nil
	}
	switch *p {
	case corev1.MountPropagationHostToContainer, corev1.MountPropagationNone:
		return *p, nil
	case corev1.MountPropagationBidirectional:
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			return "", errors.New("bidirectional mount propagation is available only to privileged containers")
		}
		return *p, nil
	}
	return "", fmt.Errorf("invalid MountPropagation mode: %q", *p)
}

// UnmountPods unmounts what the pods whose directories are under
// podDir left mounted: their memory-backed volumes and subPath bind
// mounts. Call it only when no pod worker runs on podDir.
func UnmountPods(podDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(podDir, "*"))
	var errs []error
	for _, d := range dirs {
		if err := unmountVolumes(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemovePodDir unmounts the pod's memory-backed volumes and removes what
// its volumes and files left; a directory still mounted fails the
// removal.
func RemovePodDir(dir string) error {
	if err := unmountVolumes(dir); err != nil {
		return err
	}
	err := os.RemoveAll(dir)
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("%s is still mounted: %w", dir, err)
	}
	return err
}
