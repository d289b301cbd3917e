package cri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// fakeVolumes is a backend.VolumeSource in memory; it records the token
// requests.
type fakeVolumes struct {
	mu         sync.Mutex
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	requests   []*authenticationv1.TokenRequest
	accounts   []string
}

// The kubelet's volume plugin directories under a pod's volumes/, which
// the runtime is pointed at.
const (
	pluginEmptyDir    = "kubernetes.io~empty-dir"
	pluginConfigMap   = "kubernetes.io~configmap"
	pluginSecret      = "kubernetes.io~secret"
	pluginDownwardAPI = "kubernetes.io~downward-api"
	pluginProjected   = "kubernetes.io~projected"
	// dataDirName is the atomic writer's link to the current files.
	dataDirName = "..data"
	// subPathDir is where a pod's subPaths are bind-mounted.
	subPathDir = "volume-subpaths"
)

func (f *fakeVolumes) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cm := f.configMaps[name]; cm != nil {
		return cm.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("configmap"), name)
}

func (f *fakeVolumes) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.secrets[name]; s != nil {
		return s.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secret"), name)
}

func (f *fakeVolumes) ServiceAccountToken(_ context.Context, _, sa string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req.DeepCopy())
	f.accounts = append(f.accounts, sa)
	out := req.DeepCopy()
	out.Status = authenticationv1.TokenRequestStatus{Token: "token-" + strings.Join(req.Spec.Audiences, ","), ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
	return out, nil
}

func (f *fakeVolumes) setConfigMap(cm *corev1.ConfigMap) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.configMaps[cm.Name] = cm
}

// events records the backend's events.
type events struct {
	mu   sync.Mutex
	seen []string
}

func (e *events) event(_ *corev1.Pod, _, typ, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, typ+" "+reason+" "+msg)
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.seen)
}

// eventually polls cond until it holds or 30s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %s; last %s", what, last)
		}
		<-tick.C
	}
}

func newVolumeBackend(t *testing.T, f *fakeRuntime, rec *recorder, cfg backend.Config, mutate func(*Config)) *Backend {
	t.Helper()
	cfg.Notify = rec.notify
	c := Config{
		Config: cfg, Endpoint: "unix://" + f.socket, Node: "vn1", LogDir: t.TempDir(), PodDir: t.TempDir(),
		// Plain directories for the memory-backed volumes: mounting a
		// tmpfs needs root (the e2e test checks them).
		DiskBackedVolumes: true,
		PollInterval:      5 * time.Millisecond, BackoffInitial: time.Hour, ResolvConf: writeTemp(t, "nameserver 192.0.2.53\nsearch example.com.\noptions edns0\n"),
	}
	if mutate != nil {
		mutate(&c)
	}
	b, err := New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		// The subPaths a test's pods left bind-mounted (as root).
		if err := UnmountPods(c.PodDir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return b
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readVolumeFile(t *testing.T, path string) (string, fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), st.Mode().Perm()
}

func mountAt(cfg *runtimeapi.ContainerConfig, path string) *runtimeapi.Mount {
	for _, m := range cfg.Mounts {
		if m.ContainerPath == path {
			return m
		}
	}
	return nil
}

// TestVolumes: every supported volume type is set up under the pod's
// directory and bind-mounted as its volumeMounts say (read-only for the
// API-backed ones, subPath, propagation); the projected token is asked for
// with the pod's audience, expiration and binding; a ConfigMap's change
// reaches the files through ..data; Forget removes the pod's directory.
func TestVolumes(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	src := &fakeVolumes{
		configMaps: map[string]*corev1.ConfigMap{"cfg": {ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1}}}},
		secrets:    map[string]*corev1.Secret{"sec": {ObjectMeta: metav1.ObjectMeta{Name: "sec"}, Data: map[string][]byte{"password": []byte("hunter2")}}},
	}
	hostDir := filepath.Join(t.TempDir(), "made")
	alloc := func() corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	}
	b := newVolumeBackend(t, f, rec, backend.Config{Volumes: src, NodeAllocatable: alloc}, func(c *Config) { c.VolumeResync = 10 * time.Millisecond })
	hostToContainer := corev1.MountPropagationHostToContainer
	pod := testPod("vols", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		Env: []corev1.EnvVar{{Name: "SUB", Value: "expanded"}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
		}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "scratch", MountPath: "/scratch"},
			{Name: "scratch", MountPath: "/sub", SubPathExpr: "$(SUB)"},
			{Name: "host", MountPath: "/host", MountPropagation: &hostToContainer},
			{Name: "cfg", MountPath: "/cfg"},
			{Name: "sec", MountPath: "/sec"},
			{Name: "info", MountPath: "/info"},
			{Name: "token", MountPath: "/var/run/secrets/tokens"},
		},
	})
	if os.Geteuid() != 0 {
		// A subPath is bind-mounted, which needs root: left out (the
		// subPath tests say so when they skip).
		mounts := pod.Spec.Containers[0].VolumeMounts
		pod.Spec.Containers[0].VolumeMounts = append(mounts[:1:1], mounts[2:]...)
	}
	pod.Labels = map[string]string{"b": "2", "a": "x\"y"}
	pod.Spec.ServiceAccountName = "robot"
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: &dirOrCreate}}},
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, DefaultMode: ptrTo(int32(0o640)),
			Items: []corev1.KeyToPath{{Key: "a", Path: "dir/a.txt"}, {Key: "bin", Path: "bin", Mode: ptrTo(int32(0o600))}},
		}}},
		{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec"}}},
		{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "cpu", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.cpu", Divisor: resource.MustParse("1m")}},
			{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
			{Path: "disk", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.ephemeral-storage", Divisor: resource.MustParse("1Gi")}},
		}}}},
		{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: ptrTo(int64(3607)), Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Items: []corev1.KeyToPath{{Key: "b", Path: "b"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}},
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	cfg := f.running("app")
	podDir := filepath.Join(b.cfg.PodDir, string(pod.UID))
	vol := func(plugin, name string) string { return filepath.Join(podDir, "volumes", plugin, name) }
	for _, want := range []struct {
		path, host string
		ro         bool
		prop       runtimeapi.MountPropagation
	}{
		{"/scratch", vol(pluginEmptyDir, "scratch"), false, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
		{"/sub", filepath.Join(podDir, "volume-subpaths", "scratch", "app", "1"), false, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
		{"/host", hostDir, false, runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{"/cfg", vol(pluginConfigMap, "cfg"), true, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
		{"/sec", vol(pluginSecret, "sec"), true, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
		{"/info", vol(pluginDownwardAPI, "info"), true, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
		{"/var/run/secrets/tokens", vol(pluginProjected, "token"), true, runtimeapi.MountPropagation_PROPAGATION_PRIVATE},
	} {
		if want.path == "/sub" && os.Geteuid() != 0 {
			continue
		}
		m := mountAt(cfg, want.path)
		if m == nil || m.HostPath != want.host || m.Readonly != want.ro || m.Propagation != want.prop {
			t.Errorf("mount at %s: %v, want %s read-only %v propagation %v", want.path, m, want.host, want.ro, want.prop)
		}
	}
	if st, err := os.Stat(vol(pluginEmptyDir, "scratch")); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("emptyDir: %v %v, want mode 0777", st, err)
	}
	if st, err := os.Stat(filepath.Join(vol(pluginEmptyDir, "scratch"), "expanded")); os.Geteuid() == 0 && (err != nil || !st.IsDir()) {
		t.Errorf("subPath directory: %v %v", st, err)
	}
	if st, err := os.Stat(hostDir); err != nil || !st.IsDir() {
		t.Errorf("hostPath DirectoryOrCreate: %v %v", st, err)
	}
	for _, want := range []struct {
		path, content string
		mode          fs.FileMode
	}{
		{filepath.Join(vol(pluginConfigMap, "cfg"), "dir/a.txt"), "1", 0o640},
		{filepath.Join(vol(pluginConfigMap, "cfg"), "bin"), "\x00\x01", 0o600},
		{filepath.Join(vol(pluginSecret, "sec"), "password"), "hunter2", 0o644},
		{filepath.Join(vol(pluginDownwardAPI, "info"), "name"), "vols", 0o644},
		{filepath.Join(vol(pluginDownwardAPI, "info"), "labels"), "a=\"x\\\"y\"\nb=\"2\"", 0o644},
		{filepath.Join(vol(pluginDownwardAPI, "info"), "cpu"), "1500", 0o644},
		{filepath.Join(vol(pluginDownwardAPI, "info"), "mem"), "64", 0o644},
		{filepath.Join(vol(pluginDownwardAPI, "info"), "disk"), "100", 0o644}, // unset: the node's allocatable
		{filepath.Join(vol(pluginProjected, "token"), "token"), "token-vault", 0o644},
		{filepath.Join(vol(pluginProjected, "token"), "b"), "2", 0o644},
		{filepath.Join(vol(pluginProjected, "token"), "namespace"), "ns", 0o644},
	} {
		if got, mode := readVolumeFile(t, want.path); got != want.content || mode != want.mode {
			t.Errorf("%s: %q mode %o, want %q mode %o", want.path, got, mode, want.content, want.mode)
		}
	}
	// Only the items asked for, each top-level name a link through ..data.
	if _, err := os.Lstat(filepath.Join(vol(pluginConfigMap, "cfg"), "b")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("configMap key b not in items is there: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(vol(pluginConfigMap, "cfg"), "dir")); err != nil || target != filepath.Join(dataDirName, "dir") {
		t.Errorf("dir: link to %q (%v), want ..data/dir", target, err)
	}
	src.mu.Lock()
	req, account := src.requests[0], src.accounts[0]
	src.mu.Unlock()
	if account != "robot" || !slices.Equal(req.Spec.Audiences, []string{"vault"}) || req.Spec.ExpirationSeconds == nil || *req.Spec.ExpirationSeconds != 3607 ||
		req.Spec.BoundObjectRef == nil || req.Spec.BoundObjectRef.Kind != "Pod" || req.Spec.BoundObjectRef.Name != "vols" || req.Spec.BoundObjectRef.UID != pod.UID {
		t.Errorf("token request for %q: %+v, want audience vault, 3607s, bound to the pod", account, req.Spec)
	}

	// An update of the ConfigMap is written again, atomically; the token
	// is not asked for again while it is fresh.
	src.setConfigMap(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"a": "updated", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1}}})
	src.mu.Lock()
	src.secrets["sec"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"}, Data: map[string][]byte{"apikey": []byte("k")}}
	src.mu.Unlock()
	hidden := func(dir string) []string {
		entries, _ := os.ReadDir(dir)
		var names []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "..") {
				names = append(names, e.Name())
			}
		}
		return names
	}
	// Once written: the new contents, password (no longer in the Secret)
	// gone, and only ..data and the new timestamped directory left.
	eventually(t, "the ConfigMap's and the Secret's updates in the volumes", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(vol(pluginConfigMap, "cfg"), "dir/a.txt"))
		k, _ := os.ReadFile(filepath.Join(vol(pluginSecret, "sec"), "apikey"))
		_, perr := os.Lstat(filepath.Join(vol(pluginSecret, "sec"), "password"))
		hc, hs := hidden(vol(pluginConfigMap, "cfg")), hidden(vol(pluginSecret, "sec"))
		return err == nil && string(b) == "updated" && string(k) == "k" && errors.Is(perr, fs.ErrNotExist) && len(hc) == 2 && len(hs) == 2,
			fmt.Sprintf("a.txt %q, apikey %q, password %v, hidden %v %v", b, k, perr, hc, hs)
	})
	src.mu.Lock()
	n := len(src.requests)
	src.mu.Unlock()
	if n != 1 {
		t.Errorf("%d token requests, want 1 while the token is fresh", n)
	}

	if err := b.Forget(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(podDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the pod's directory is still there after Forget: %v", err)
	}
}

// TestVolumeMissingConfigMap: a required ConfigMap that does not exist
// keeps the pod's containers waiting in ContainerCreating, without a
// sandbox, with the kubelet's FailedMount event; once it exists the pod
// runs. An optional one that does not exist is an empty volume.
func TestVolumeMissingConfigMap(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	src := &fakeVolumes{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	ev := &events{}
	b := newVolumeBackend(t, f, rec, backend.Config{Volumes: src, Event: ev.event}, nil)
	pod := testPod("missing", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}, {Name: "opt", MountPath: "/opt"}},
	})
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}},
		{Name: "opt", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "nope", Optional: ptrTo(true)}}},
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	const want = `Warning FailedMount MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found`
	eventually(t, "the FailedMount event", func() (bool, string) {
		return slices.Contains(ev.list(), want), strings.Join(ev.list(), "; ")
	})
	p := b.Pods()[0]
	if p.Status.Phase != corev1.PodPending || !waitingReason(p, "ContainerCreating") {
		t.Errorf("status %+v, want Pending with the container waiting in ContainerCreating", p.Status)
	}
	if sandboxes, _ := f.counts(); sandboxes != 0 {
		t.Errorf("%d sandboxes before the volume could be set up, want none", sandboxes)
	}
	src.setConfigMap(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "absent"}, Data: map[string]string{"k": "v"}})
	rec.wait(t, pod.UID, "Running once the ConfigMap exists", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	entries, err := os.ReadDir(filepath.Join(b.cfg.PodDir, string(pod.UID), "volumes", pluginSecret, "opt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			t.Errorf("optional missing Secret: volume has %s, want nothing", e.Name())
		}
	}
}

// TestSandboxDNSPortsHostsAndTerminationMessage: the sandbox has the
// kubelet's DNS configuration, hostname and port mappings; the container
// the pod's managed /etc/hosts and a termination message file, whose
// content becomes the terminated state's message.
func TestSandboxDNSPortsHostsAndTerminationMessage(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newVolumeBackend(t, f, rec, backend.Config{}, func(c *Config) {
		c.ClusterDNS, c.ClusterDomain = []string{"10.96.0.10"}, "cluster.local"
	})
	pod := testPod("web", corev1.RestartPolicyNever, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		TerminationMessagePath: "/dev/termination-log",
		Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 8080, HostIP: "127.0.0.1"},
			{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP},
			{Name: "metrics", ContainerPort: 9090},
		},
	})
	pod.Spec.Hostname, pod.Spec.Subdomain = "www", "sub"
	pod.Spec.HostAliases = []corev1.HostAlias{{IP: "192.0.2.1", Hostnames: []string{"foo", "bar"}}}
	pod.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"extra.test"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptrTo("2")}, {Name: "rotate"}}}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	f.mu.Lock()
	var sb *runtimeapi.PodSandboxConfig
	for _, s := range f.sandboxes {
		sb = s.cfg
	}
	f.mu.Unlock()
	dns := sb.GetDnsConfig()
	if !slices.Equal(dns.GetServers(), []string{"10.96.0.10"}) ||
		!slices.Equal(dns.GetSearches(), []string{"ns.svc.cluster.local", "svc.cluster.local", "cluster.local", "example.com", "extra.test"}) ||
		!slices.Equal(dns.GetOptions(), []string{"ndots:2", "rotate"}) {
		t.Errorf("DNS config %v, want the cluster server, the cluster then host search path, the pod's options over ndots:5", dns)
	}
	if sb.Hostname != "www" {
		t.Errorf("sandbox hostname %q, want www", sb.Hostname)
	}
	var ports []string
	for _, p := range sb.PortMappings {
		ports = append(ports, p.Protocol.String()+" "+p.HostIp+" "+net.JoinHostPort("", itoa(p.HostPort))+"->"+itoa(p.ContainerPort))
	}
	if want := []string{"TCP 127.0.0.1 :8080->80", "UDP  :5353->53", "TCP  :0->9090"}; !slices.Equal(ports, want) {
		t.Errorf("port mappings %q, want %q", ports, want)
	}

	cfg := f.running("app")
	hosts := mountAt(cfg, "/etc/hosts")
	if hosts == nil {
		t.Fatalf("no /etc/hosts mount in %v", cfg.Mounts)
	}
	got, _ := readVolumeFile(t, hosts.HostPath)
	want := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
		"10.9.9.9\twww.sub.ns.svc.cluster.local\twww\n\n# Entries added by HostAliases.\n192.0.2.1\tfoo\tbar\n"
	if got != want {
		t.Errorf("/etc/hosts:\n%s\nwant:\n%s", got, want)
	}
	term := mountAt(cfg, "/dev/termination-log")
	if term == nil || !strings.HasPrefix(term.HostPath, filepath.Join(b.cfg.PodDir, string(pod.UID), "containers", "app")+"/") {
		t.Fatalf("termination log mount %v, want a file under the pod's containers/app", term)
	}
	if _, mode := readVolumeFile(t, term.HostPath); mode != 0o666 {
		t.Errorf("termination log file mode %o, want 0666", mode)
	}
	if err := os.WriteFile(term.HostPath, []byte("goodbye"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.exit(t, "app", 0)
	done := rec.wait(t, pod.UID, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if tm := done.Status.ContainerStatuses[0].State.Terminated; tm == nil || tm.Message != "goodbye" {
		t.Errorf("terminated %+v, want the message goodbye", tm)
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

// TestFallbackToLogsOnError: a failed container that wrote no message has
// the end of its log as the message.
func TestFallbackToLogsOnError(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newVolumeBackend(t, f, rec, backend.Config{}, nil)
	pod := testPod("fails", corev1.RestartPolicyNever, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	f.exit(t, "app", 2)
	done := rec.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if tm := done.Status.ContainerStatuses[0].State.Terminated; tm == nil || tm.Message != "started app attempt 0\n" {
		t.Errorf("terminated %+v, want the log's last line as the message", tm)
	}
}

// TestDNSPolicies: the kubelet's GetPodDNS for each policy, with and
// without cluster DNS servers.
func TestDNSPolicies(t *testing.T) {
	t.Parallel()
	resolv := writeTemp(t, "# comment\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch a.test b.test.\noptions timeout:1 edns0\n")
	for _, tc := range []struct {
		name       string
		policy     corev1.DNSPolicy
		hostNet    bool
		clusterDNS []string
		podDNS     *corev1.PodDNSConfig
		want       *runtimeapi.DNSConfig
		event      string
	}{
		{name: "cluster first", policy: corev1.DNSClusterFirst, clusterDNS: []string{"10.96.0.10", "10.96.0.11"},
			want: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10", "10.96.0.11"}, Searches: []string{"ns.svc.c.local", "svc.c.local", "c.local", "a.test", "b.test"}, Options: []string{"ndots:5"}}},
		{name: "empty policy is cluster first", clusterDNS: []string{"10.96.0.10"},
			want: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"ns.svc.c.local", "svc.c.local", "c.local", "a.test", "b.test"}, Options: []string{"ndots:5"}}},
		{name: "cluster first without cluster DNS falls back to the host's", policy: corev1.DNSClusterFirst,
			want:  &runtimeapi.DNSConfig{Servers: []string{"192.0.2.53", "192.0.2.54"}, Searches: []string{"a.test", "b.test"}, Options: []string{"timeout:1", "edns0"}},
			event: `Warning MissingClusterDNS pod: "p_ns(uid-p)". kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`},
		{name: "cluster first on the host network is the host's", policy: corev1.DNSClusterFirst, hostNet: true, clusterDNS: []string{"10.96.0.10"},
			want: &runtimeapi.DNSConfig{Servers: []string{"192.0.2.53", "192.0.2.54"}, Searches: []string{"a.test", "b.test"}, Options: []string{"timeout:1", "edns0"}}},
		{name: "cluster first with host net", policy: corev1.DNSClusterFirstWithHostNet, hostNet: true, clusterDNS: []string{"10.96.0.10"},
			want: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"ns.svc.c.local", "svc.c.local", "c.local", "a.test", "b.test"}, Options: []string{"ndots:5"}}},
		{name: "default", policy: corev1.DNSDefault, clusterDNS: []string{"10.96.0.10"},
			want: &runtimeapi.DNSConfig{Servers: []string{"192.0.2.53", "192.0.2.54"}, Searches: []string{"a.test", "b.test"}, Options: []string{"timeout:1", "edns0"}}},
		{name: "none", policy: corev1.DNSNone, clusterDNS: []string{"10.96.0.10"},
			podDNS: &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"x.test"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptrTo("1")}}},
			want:   &runtimeapi.DNSConfig{Servers: []string{"1.1.1.1"}, Searches: []string{"x.test"}, Options: []string{"ndots:1"}}},
		{name: "too many servers", policy: corev1.DNSDefault,
			podDNS: &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8"}},
			want:   &runtimeapi.DNSConfig{Servers: []string{"192.0.2.53", "192.0.2.54", "1.1.1.1"}, Searches: []string{"a.test", "b.test"}, Options: []string{"timeout:1", "edns0"}},
			event:  "Warning DNSConfigForming Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 192.0.2.53 192.0.2.54 1.1.1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := &events{}
			pr := &podRun{b: &Backend{cfg: Config{Config: backend.Config{Event: ev.event}, ResolvConf: resolv, ClusterDNS: tc.clusterDNS, ClusterDomain: "c.local"}}}
			pr.pod = testPod("p", corev1.RestartPolicyNever, corev1.Container{Name: "app"})
			pr.pod.Spec.DNSPolicy, pr.pod.Spec.HostNetwork, pr.pod.Spec.DNSConfig = tc.policy, tc.hostNet, tc.podDNS
			got, err := pr.dnsConfig()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Servers, tc.want.Servers) || !slices.Equal(got.Searches, tc.want.Searches) || !slices.Equal(got.Options, tc.want.Options) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			var wantEvents []string
			if tc.event != "" {
				wantEvents = []string{tc.event}
			}
			if !slices.Equal(ev.list(), wantEvents) {
				t.Errorf("events %q, want %q", ev.list(), wantEvents)
			}
		})
	}
}

// TestVolumeFSGroup: with an fsGroup, as the kubelet's SetVolumeOwnership,
// the volumes' files and directories get the group and group permission
// (read-only for the API-backed volumes, read-write for emptyDir; setgid
// directories), and the token is written 0600 before that.
func TestVolumeFSGroup(t *testing.T) {
	t.Parallel()
	gid := int64(os.Getgid())
	if os.Geteuid() == 0 {
		gid = 4242 // root may give any group: one it does not have
	}
	f := newFakeRuntime(t)
	rec := newRecorder()
	src := &fakeVolumes{configMaps: map[string]*corev1.ConfigMap{"cfg": {ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"a": "1"}}}}
	b := newVolumeBackend(t, f, rec, backend.Config{Volumes: src}, nil)
	pod := testPod("fsgroup", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever})
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &gid}
	pod.Spec.ServiceAccountName = "robot"
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, DefaultMode: ptrTo(int32(0o600))}}},
		{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
		}}}},
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	vols := filepath.Join(b.cfg.PodDir, string(pod.UID), "volumes")
	for _, want := range []struct {
		path string
		mode fs.FileMode
	}{
		{filepath.Join(vols, pluginEmptyDir, "scratch"), fs.ModeDir | fs.ModeSetgid | 0o777},
		{filepath.Join(vols, pluginConfigMap, "cfg", "a"), 0o640},
		{filepath.Join(vols, pluginConfigMap, "cfg", dataDirName), fs.ModeDir | fs.ModeSetgid | 0o755},
		{filepath.Join(vols, pluginProjected, "token", "token"), 0o640},
	} {
		st, err := os.Stat(want.path)
		if err != nil {
			t.Fatal(err)
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok || int64(sys.Gid) != gid || st.Mode() != want.mode {
			t.Errorf("%s: mode %v group %v, want %v group %d", want.path, st.Mode(), sys.Gid, want.mode, gid)
		}
	}
}

// TestHostNetworkEtcHosts: a hostNetwork pod's sandbox has no hostname of
// its own (the node's) and the node's DNS configuration for ClusterFirst;
// its containers get the node's /etc/hosts under the kubelet's header with
// the pod's aliases, but one that mounts a volume at /etc/hosts keeps it.
func TestHostNetworkEtcHosts(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	hostsFile := writeTemp(t, "127.0.0.1 localhost\n192.0.2.2 node1\n")
	b := newVolumeBackend(t, f, rec, backend.Config{NodeIP: "192.0.2.2"}, func(c *Config) {
		c.HostsFile, c.ClusterDNS = hostsFile, []string{"10.96.0.10"}
	})
	pod := testPod("hostnet", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever})
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "own", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		VolumeMounts: []corev1.VolumeMount{{Name: "hosts", MountPath: "/etc/hosts", SubPath: subPathIfRoot("hosts")}}})
	pod.Spec.Volumes = []corev1.Volume{{Name: "hosts", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.HostNetwork = true
	pod.Spec.HostAliases = []corev1.HostAlias{{IP: "192.0.2.9", Hostnames: []string{"db"}}}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	f.mu.Lock()
	var sb *runtimeapi.PodSandboxConfig
	for _, s := range f.sandboxes {
		sb = s.cfg
	}
	f.mu.Unlock()
	if sb.Hostname != "" || !slices.Equal(sb.GetDnsConfig().GetServers(), []string{"192.0.2.53"}) {
		t.Errorf("sandbox hostname %q DNS %v, want none (the node's) and the node's resolver", sb.Hostname, sb.GetDnsConfig())
	}
	hosts := mountAt(f.running("app"), "/etc/hosts")
	if hosts == nil {
		t.Fatal("no /etc/hosts mount")
	}
	got, _ := readVolumeFile(t, hosts.HostPath)
	if want := "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n192.0.2.2 node1\n\n# Entries added by HostAliases.\n192.0.2.9\tdb\n"; got != want {
		t.Errorf("/etc/hosts %q, want %q", got, want)
	}
	own := mountAt(f.running("own"), "/etc/hosts")
	if wantIn := filepath.Join(subPathDir, "hosts", "own"); os.Geteuid() != 0 {
		wantIn = filepath.Join(pluginEmptyDir, "hosts")
		if own == nil || !strings.Contains(own.HostPath, wantIn) {
			t.Errorf("container own: /etc/hosts mount %v, want its emptyDir only", own)
		}
	} else if own == nil || !strings.Contains(own.HostPath, wantIn) {
		t.Errorf("container own: /etc/hosts mount %v, want its emptyDir's subPath only", own)
	}
	if n := len(f.running("own").Mounts); n != 1 {
		t.Errorf("container own has %d mounts, want its volume's only", n)
	}
}

// TestFQDNTooLong: a pod whose FQDN hostname does not fit the kernel's 64
// characters gets no sandbox, its containers waiting with the kubelet's
// message.
func TestFQDNTooLong(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newVolumeBackend(t, f, rec, backend.Config{}, func(c *Config) { c.ClusterDomain = "cluster.local" })
	pod := testPod("fqdn", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever})
	pod.Spec.Hostname, pod.Spec.Subdomain, pod.Spec.SetHostnameAsFQDN = strings.Repeat("h", 40), "sub", ptrTo(true)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	p := rec.wait(t, pod.UID, "waiting with the FQDN error", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && strings.Contains(cs[0].State.Waiting.Message, "is too long (64 characters is the max, 65 characters requested)")
	})
	if sandboxes, _ := f.counts(); sandboxes != 0 || p.Status.Phase != corev1.PodPending {
		t.Errorf("%d sandboxes, phase %s; want none, Pending", sandboxes, p.Status.Phase)
	}
}

// subPathIfRoot is sub for a test run as root, else "" (a subPath is
// bind-mounted, which needs root).
func subPathIfRoot(sub string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	return sub
}
