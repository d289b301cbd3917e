package cri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
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

// podVolumes is what the backend set up for a pod's volumes.
type podVolumes struct {
	mounted map[string]hostVolume // nil until every volume is set up
	synced  time.Time
	failed  string // the last FailedMount message
	retryAt time.Time
	retry   time.Duration
	tokens  map[string]*authenticationv1.TokenRequest // volume/path -> the token written
	ready   map[string]bool                           // emptyDirs set up (mode, fsGroup)
}

// subPathDir is where, below a pod's directory, its subPaths are
// bind-mounted for the runtime (the kubelet's volume-subpaths).
const subPathDir = "volume-subpaths"

func (pr *podRun) podDir() string { return filepath.Join(pr.b.cfg.PodDir, string(pr.pod.UID)) }

func (pr *podRun) volumeDir(plugin, name string) string {
	return filepath.Join(pr.podDir(), "volumes", plugin, name)
}

// syncVolumes sets up the pod's volumes before its sandbox, as the
// kubelet waits for them to be mounted (WaitForAttachAndMount), and
// rewrites the ConfigMap, Secret, downward API and token contents every
// VolumeResync so that running containers see updates. It reports
// whether the containers may start.
func (pr *podRun) syncVolumes(ctx context.Context) bool {
	now := time.Now()
	v := &pr.vols
	if v.mounted != nil && now.Sub(v.synced) < pr.b.cfg.VolumeResync {
		return true
	}
	if now.Before(v.retryAt) {
		return v.mounted != nil
	}
	m, err := pr.setupVolumes(ctx)
	if err == nil {
		v.mounted, v.synced, v.failed, v.retry = m, now, "", 0
		return true
	}
	// As the kubelet: the failure is an event on the pod, retried with
	// an exponential back-off; a volume that was set up keeps what it
	// showed.
	v.retry = min(max(2*v.retry, firstMountRetry), maxMountRetry)
	v.retryAt = now.Add(v.retry)
	if msg := err.Error(); msg != v.failed {
		v.failed = msg
		pr.podEvent(corev1.EventTypeWarning, podruntime.EventFailedMount, msg)
	}
	pr.b.log.Warn("Setting up a volume", "pod", pr.key(), "err", err)
	return v.mounted != nil
}

// podEvent records an event about the pod itself.
func (pr *podRun) podEvent(eventType, reason, message string) {
	if pr.b.cfg.Event != nil {
		pr.b.cfg.Event(pr.pod, "", eventType, reason, message)
	}
}

func (pr *podRun) setupVolumes(ctx context.Context) (map[string]hostVolume, error) {
	m := map[string]hostVolume{}
	for _, vol := range pr.pod.Spec.Volumes {
		hv, err := pr.setupVolume(ctx, vol)
		if err != nil {
			return nil, podruntime.MountFailedError(vol.Name, err)
		}
		m[vol.Name] = hv
	}
	return m, nil
}

func (pr *podRun) setupVolume(ctx context.Context, vol corev1.Volume) (hostVolume, error) {
	src := vol.VolumeSource
	switch {
	case src.EmptyDir != nil:
		dir := pr.volumeDir(pluginEmptyDir, vol.Name)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return hostVolume{}, err
		}
		if src.EmptyDir.Medium == corev1.StorageMediumMemory {
			if err := pr.memoryBacked(dir, src.EmptyDir.SizeLimit); err != nil {
				return hostVolume{}, err
			}
		}
		if pr.vols.ready[vol.Name] {
			// Set up before: as the kubelet's emptyDir (its ready
			// marker), not walked again while the pod writes it.
			return hostVolume{path: dir}, nil
		}
		if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // the kubelet's mode for emptyDir
			return hostVolume{}, err
		}
		if err := pr.setOwnership(dir, false); err != nil {
			return hostVolume{}, err
		}
		if pr.vols.ready == nil {
			pr.vols.ready = map[string]bool{}
		}
		pr.vols.ready[vol.Name] = true
		return hostVolume{path: dir}, nil
	case src.HostPath != nil:
		return hostVolume{path: src.HostPath.Path}, checkHostPathType(src.HostPath.Path, src.HostPath.Type)
	case src.ConfigMap != nil:
		payload, err := pr.configMapPayload(ctx, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.DefaultMode, src.ConfigMap.Optional)
		return pr.writeVolume(pluginConfigMap, vol.Name, payload, err)
	case src.Secret != nil:
		payload, err := pr.secretPayload(ctx, src.Secret.SecretName, src.Secret.Items, src.Secret.DefaultMode, src.Secret.Optional)
		return pr.writeMemoryVolume(pluginSecret, vol.Name, payload, err)
	case src.DownwardAPI != nil:
		payload, err := pr.downwardAPIPayload(src.DownwardAPI.Items, src.DownwardAPI.DefaultMode)
		return pr.writeMemoryVolume(pluginDownwardAPI, vol.Name, payload, err)
	case src.Projected != nil:
		payload, err := pr.projectedPayload(ctx, vol.Name, src.Projected)
		return pr.writeMemoryVolume(pluginProjected, vol.Name, payload, err)
	}
	return hostVolume{}, errors.New("dpkit node's cri backend sets up emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes only")
}

// writeMemoryVolume is writeVolume on a tmpfs: the kubelet backs secret,
// projected and downwardAPI volumes with memory (their wrapped
// emptyDir{medium: Memory}), so that Secrets and tokens never reach the
// node's disk.
func (pr *podRun) writeMemoryVolume(plugin, name string, payload map[string]file, err error) (hostVolume, error) {
	if err != nil {
		return hostVolume{}, err
	}
	if err := pr.memoryBacked(pr.volumeDir(plugin, name), nil); err != nil {
		return hostVolume{}, err
	}
	return pr.writeVolume(plugin, name, payload, nil)
}

// memoryBacked mounts a tmpfs at dir, unless Config.DiskBackedVolumes.
func (pr *podRun) memoryBacked(dir string, sizeLimit *resource.Quantity) error {
	if pr.b.cfg.DiskBackedVolumes {
		return os.MkdirAll(dir, 0o750)
	}
	var alloc corev1.ResourceList
	if pr.b.cfg.NodeAllocatable != nil {
		alloc = pr.b.cfg.NodeAllocatable()
	}
	return mountTmpfs(dir, tmpfsSize(pr.pod, alloc, sizeLimit))
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

func (pr *podRun) writeVolume(plugin, name string, payload map[string]file, err error) (hostVolume, error) {
	if err != nil {
		return hostVolume{}, err
	}
	dir := pr.volumeDir(plugin, name)
	if err := writeAtomic(dir, payload); err != nil {
		return hostVolume{}, fmt.Errorf("writing the volume's files: %w", err)
	}
	return hostVolume{path: dir, readOnly: true}, pr.setOwnership(dir, true)
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
func (pr *podRun) setOwnership(dir string, readOnly bool) error {
	psc := pr.pod.Spec.SecurityContext
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

func (pr *podRun) volumeSource() (backend.VolumeSource, error) {
	if pr.b.cfg.Volumes == nil {
		return nil, errors.New("the node reads no ConfigMaps, Secrets or tokens (backend.Config.Volumes is nil)")
	}
	return pr.b.cfg.Volumes, nil
}

// configMapPayload is the kubelet's configmap.MakePayload: every key, or
// the items asked for; a missing key fails unless optional.
func (pr *podRun) configMapPayload(ctx context.Context, name string, items []corev1.KeyToPath, defMode *int32, optional *bool) (map[string]file, error) {
	src, err := pr.volumeSource()
	if err != nil {
		return nil, err
	}
	opt := optional != nil && *optional
	cm, err := readOptional(ctx, src.ConfigMap, pr.pod.Namespace, name, opt)
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
func (pr *podRun) secretPayload(ctx context.Context, name string, items []corev1.KeyToPath, defMode *int32, optional *bool) (map[string]file, error) {
	src, err := pr.volumeSource()
	if err != nil {
		return nil, err
	}
	opt := optional != nil && *optional
	s, err := readOptional(ctx, src.Secret, pr.pod.Namespace, name, opt)
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
func (pr *podRun) downwardAPIPayload(items []corev1.DownwardAPIVolumeFile, defMode *int32) (map[string]file, error) {
	payload := map[string]file{}
	var errs []error
	for _, it := range items {
		var value string
		var err error
		switch {
		case it.FieldRef != nil:
			value, err = fieldValue(pr.pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			var alloc corev1.ResourceList
			if pr.b.cfg.NodeAllocatable != nil {
				alloc = pr.b.cfg.NodeAllocatable()
			}
			value, err = resourceValue(pr.pod, it.ResourceFieldRef, alloc)
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
func (pr *podRun) projectedPayload(ctx context.Context, volName string, p *corev1.ProjectedVolumeSource) (map[string]file, error) {
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
			add(pr.configMapPayload(ctx, s.ConfigMap.Name, s.ConfigMap.Items, p.DefaultMode, s.ConfigMap.Optional))
		case s.Secret != nil:
			add(pr.secretPayload(ctx, s.Secret.Name, s.Secret.Items, p.DefaultMode, s.Secret.Optional))
		case s.DownwardAPI != nil:
			add(pr.downwardAPIPayload(s.DownwardAPI.Items, p.DefaultMode))
		case s.ServiceAccountToken != nil:
			tok, err := pr.token(ctx, volName, s.ServiceAccountToken)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// As the kubelet: with an fsGroup the token is for the
			// owner, and the group gets read access from setOwnership.
			m := mode(nil, p.DefaultMode)
			if psc := pr.pod.Spec.SecurityContext; psc != nil && psc.FSGroup != nil {
				m = 0o600
			}
			payload[s.ServiceAccountToken.Path] = file{data: []byte(tok), mode: m}
		default:
			errs = append(errs, errors.New("dpkit node's cri backend projects configMap, secret, downwardAPI and serviceAccountToken sources only"))
		}
	}
	return payload, errors.Join(errs...)
}

func (pr *podRun) token(ctx context.Context, volName string, tp *corev1.ServiceAccountTokenProjection) (string, error) {
	key := volName + "/" + tp.Path
	if tr := pr.vols.tokens[key]; tr != nil && !tokenNeedsRefresh(tr, time.Now()) {
		return tr.Status.Token, nil
	}
	src, err := pr.volumeSource()
	if err != nil {
		return "", err
	}
	var auds []string
	if tp.Audience != "" {
		auds = []string{tp.Audience}
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: auds, ExpirationSeconds: tp.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pr.pod.Name, UID: pr.pod.UID},
	}}
	tr, err := src.ServiceAccountToken(ctx, pr.pod.Namespace, pr.pod.Spec.ServiceAccountName, req)
	if err != nil {
		return "", err
	}
	if pr.vols.tokens == nil {
		pr.vols.tokens = map[string]*authenticationv1.TokenRequest{}
	}
	if tr.Spec.ExpirationSeconds == nil {
		tr.Spec.ExpirationSeconds = tp.ExpirationSeconds
	}
	pr.vols.tokens[key] = tr
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

// volumeMounts are the container's mounts of the pod's volumes, as the
// kubelet's makeMounts makes them: subPath (and subPathExpr, expanded
// from the container's environment) within the volume, created as a
// directory when missing; read-only when the mount or the volume is;
// mountPropagation as the runtime's propagation.
func (pr *podRun) volumeMounts(spec *corev1.Container, vars map[string]string) ([]*runtimeapi.Mount, error) {
	var out []*runtimeapi.Mount
	for i, m := range spec.VolumeMounts {
		hv, ok := pr.vols.mounted[m.Name]
		if !ok {
			return nil, fmt.Errorf("cannot find volume %q to mount into container %q", m.Name, spec.Name)
		}
		host := hv.path
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = podruntime.Expand(m.SubPathExpr, vars)
		}
		if sub != "" {
			if err := validatePath(filepath.Clean(sub)); err != nil || filepath.IsAbs(sub) {
				return nil, fmt.Errorf("subPath %q of volume %q: must be a relative path within the volume", sub, m.Name)
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
				return nil, fmt.Errorf("failed to prepare subPath for volumeMount %q of container %q: %w", m.Name, spec.Name, err)
			}
			host = filepath.Join(pr.podDir(), subPathDir, m.Name, spec.Name, strconv.Itoa(i))
			err = bindSubPath(fd, host)
			_ = syscall.Close(fd)
			if err != nil {
				return nil, fmt.Errorf("failed to prepare subPath for volumeMount %q of container %q: %w", m.Name, spec.Name, err)
			}
		}
		prop, err := propagation(m.MountPropagation, spec)
		if err != nil {
			return nil, err
		}
		out = append(out, &runtimeapi.Mount{ContainerPath: m.MountPath, HostPath: host, Readonly: m.ReadOnly || hv.readOnly, Propagation: prop})
	}
	return out, nil
}

// propagation is the kubelet's translation of mountPropagation; only a
// privileged container may ask for Bidirectional.
func propagation(p *corev1.MountPropagationMode, c *corev1.Container) (runtimeapi.MountPropagation, error) {
	if p == nil {
		return runtimeapi.MountPropagation_PROPAGATION_PRIVATE, nil
	}
	switch *p {
	case corev1.MountPropagationHostToContainer:
		return runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, nil
	case corev1.MountPropagationBidirectional:
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			return 0, errors.New("bidirectional mount propagation is available only to privileged containers")
		}
		return runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL, nil
	case corev1.MountPropagationNone:
		return runtimeapi.MountPropagation_PROPAGATION_PRIVATE, nil
	}
	return 0, fmt.Errorf("invalid MountPropagation mode: %q", *p)
}

// UnmountPods unmounts what the pods under podDir (a Backend's
// Config.PodDir) left mounted: their memory-backed volumes and subPath
// bind mounts. A Backend that closes leaves them, as a kubelet that stops
// does, for the next Backend on the same directory to adopt the pods;
// UnmountPods is for when no node will (a node taken out of service, a
// test ending). Call it only when no Backend runs on podDir; the running
// containers keep their own mounts.
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

// removePodDir unmounts the pod's memory-backed volumes and removes what
// its volumes and files left; a directory still mounted fails the
// removal.
func removePodDir(dir string) error {
	if err := unmountVolumes(dir); err != nil {
		return err
	}
	err := os.RemoveAll(dir)
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("%s is still mounted: %w", dir, err)
	}
	return err
}
