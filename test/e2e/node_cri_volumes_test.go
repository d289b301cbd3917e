package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// TestVirtualNodeCRIVolumes: with the cri backend on a containerd of its
// own, a pod's configMap (also one key of it by subPath), secret, emptyDir
// and projected (service account token, downward API) volumes are in its
// container with their content;
// the token is one the API server's TokenReview accepts for the pod's
// service account and audience, bound to the pod. The container has the
// kubelet's /etc/hosts and DNS configuration (cluster DNS and search path
// from --cluster-dns and --cluster-domain) and its termination message
// reaches the pod status. A pod whose ConfigMap does not exist waits in
// ContainerCreating with the kubelet's FailedMount event. A failed
// container with FallbackToLogsOnError has the end of its log as message.
func TestVirtualNodeCRIVolumes(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-vol")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	o.ClusterDNS, o.ClusterDomain = []string{"10.96.0.10"}, "cluster.local"
	runNode(t, ctx, o)

	ns := createNamespace(t, c, "vncri-vol")
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"greeting": "hello from the configmap"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"}, StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const audience = "dpkit-e2e"
	script := `set -e
echo "cfg=$(cat /cfg/greeting)"
echo "sub=$(cat /etc/greeting)"
echo "sec=$(cat /sec/password)"
echo scratch-ok > /scratch/x; echo "scratch=$(cat /scratch/x)"
echo "ns=$(cat /projected/namespace)"
echo "token=$(cat /projected/token)"
touch /cfg/new 2>/dev/null || echo "cfg read-only"
awk '$2=="/sec" || $2=="/projected" || $2=="/mem" {print "fs " $2 " " $3}' /proc/mounts
awk '$2=="/sec" || $2=="/mem" {n=split($4, o, ","); for (i=1; i<=n; i++) if (o[i] ~ /^size=/) print "size " $2 " " o[i]}' /proc/mounts
echo "--- hosts"; cat /etc/hosts
echo "--- resolv"; cat /etc/resolv.conf
echo "--- end"
echo "all done" > /dev/termination-log`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vols", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: "robot",
			NodeSelector:       map[string]string{"kubernetes.io/hostname": name},
			Tolerations:        []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			HostAliases:        []corev1.HostAlias{{IP: "192.0.2.7", Hostnames: []string{"alias.test"}}},
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "cfg", MountPath: "/cfg"}, {Name: "cfg", MountPath: "/etc/greeting", SubPath: "greeting"}, {Name: "sec", MountPath: "/sec"},
					{Name: "scratch", MountPath: "/scratch"}, {Name: "projected", MountPath: "/projected"}, {Name: "mem", MountPath: "/mem"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
				{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec"}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "mem", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("1Mi"))}}},
				{Name: "projected", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: audience, ExpirationSeconds: ptr(int64(3600)), Path: "token"}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
		},
	}
	created, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := waitPod(t, ctx, c, ns, "vols", "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	b, err := c.CoreV1().Pods(ns).GetLogs("vols", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logs := string(b)
	t.Logf("container log:\n%s", logs)
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s: %+v", done.Status.Phase, done.Status.ContainerStatuses)
	}
	for _, want := range []string{"cfg=hello from the configmap\n", "sub=hello from the configmap\n", "sec=hunter2\n", "scratch=scratch-ok\n", "ns=" + ns + "\n", "cfg read-only\n", "fs /sec tmpfs\n", "fs /projected tmpfs\n", "fs /mem tmpfs\n",
		// The node's allocatable memory (8Gi) for the secret, the
		// sizeLimit for the memory emptyDir.
		"size /sec size=8388608k\n", "size /mem size=1024k\n"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log: no %q", want)
		}
	}
	token := ""
	for line := range strings.SplitSeq(logs, "\n") {
		if v, ok := strings.CutPrefix(line, "token="); ok {
			token = v
		}
	}
	tr, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := tr.Status
	if !st.Authenticated || st.User.Username != "system:serviceaccount:"+ns+":robot" || !slices.Equal(st.Audiences, []string{audience}) ||
		!slices.Equal(st.User.Extra["authentication.kubernetes.io/pod-name"], authenticationv1.ExtraValue{"vols"}) ||
		!slices.Equal(st.User.Extra["authentication.kubernetes.io/pod-uid"], authenticationv1.ExtraValue{string(created.UID)}) {
		t.Errorf("TokenReview of the projected token: %+v, want robot of %s for audience %s, bound to the pod", st, ns, audience)
	}

	// The kubelet's /etc/hosts (the pod's IP and name, the aliases) and
	// DNS configuration.
	section := func(from, to string) string {
		_, rest, _ := strings.Cut(logs, from+"\n")
		s, _, _ := strings.Cut(rest, to+"\n")
		return s
	}
	hosts, resolv := section("--- hosts", "--- resolv"), section("--- resolv", "--- end")
	if !strings.HasPrefix(hosts, "# Kubernetes-managed hosts file.\n") || !strings.Contains(hosts, done.Status.PodIP+"\tvols\n") ||
		!strings.Contains(hosts, "# Entries added by HostAliases.\n192.0.2.7\talias.test\n") {
		t.Errorf("/etc/hosts:\n%s\nwant the managed header, %s for vols and the alias", hosts, done.Status.PodIP)
	}
	if !strings.Contains(resolv, "nameserver 10.96.0.10\n") || strings.Count(resolv, "nameserver") != 1 ||
		!strings.Contains(resolv, "search "+ns+".svc.cluster.local svc.cluster.local cluster.local") || !strings.Contains(resolv, "options ndots:5") {
		t.Errorf("/etc/resolv.conf:\n%s\nwant the cluster DNS server, search path and ndots:5", resolv)
	}
	if tm := done.Status.ContainerStatuses[0].State.Terminated; tm == nil || tm.Message != "all done\n" {
		t.Errorf("terminated %+v, want the message from /dev/termination-log", tm)
	}

	// A failed container that wrote no termination message, with
	// FallbackToLogsOnError: the end of its log, which the runtime wrote
	// where its container status says.
	fails := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fails", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  pod.Spec.NodeSelector, Tolerations: pod.Spec.Tolerations,
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:                  []string{"sh", "-c", "echo first; echo last words; exit 3"},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, fails, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := waitPod(t, ctx, c, ns, "fails", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if tm := failed.Status.ContainerStatuses[0].State.Terminated; tm == nil || tm.ExitCode != 3 || tm.Message != "first\nlast words\n" {
		t.Errorf("pod fails: terminated %+v, want exit code 3 and the log as the message", tm)
	}

	// A ConfigMap that does not exist: ContainerCreating and FailedMount.
	missing := pod.DeepCopy()
	missing.Name = "missing"
	missing.Spec.Volumes[0].ConfigMap.Name = "absent"
	if _, err := c.CoreV1().Pods(ns).Create(ctx, missing, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := `MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found`
	poll(t, ctx, "the FailedMount event of pod missing", func(ctx context.Context) (bool, string, error) {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=missing,reason=FailedMount"})
		if err != nil {
			return false, "", err
		}
		var msgs []string
		for _, e := range evs.Items {
			msgs = append(msgs, e.Type+" "+e.Message)
		}
		return slices.Contains(msgs, corev1.EventTypeWarning+" "+want), fmt.Sprint(msgs), nil
	})
	p, err := c.CoreV1().Pods(ns).Get(ctx, "missing", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := p.Status.ContainerStatuses; p.Status.Phase != corev1.PodPending || len(cs) != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "ContainerCreating" {
		t.Errorf("pod missing: %s %+v, want Pending, waiting in ContainerCreating", p.Status.Phase, p.Status.ContainerStatuses)
	}
	if sandboxes, _, err := rtm.podObjects(ctx, string(p.UID)); err != nil || len(sandboxes) != 0 {
		t.Errorf("pod missing: sandboxes %v (%v), want none before its volumes are set up", sandboxes, err)
	}

	// Deleted, the pods leave no tmpfs mounted and no directory under the
	// node's root.
	for _, name := range []string{"vols", "fails", "missing"} {
		if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, ctx, "the pods gone, with their tmpfs mounts and directories", func(ctx context.Context) (bool, string, error) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		under := mountsUnder(t, root)
		dirs, _ := filepath.Glob(filepath.Join(root, "pods", string(created.UID)))
		return len(pods.Items) == 0 && len(under) == 0 && len(dirs) == 0, fmt.Sprintf("pods %d, mounts %v, pod directories %v", len(pods.Items), under, dirs), nil
	})
}

// TestVirtualNodeCRIHostPort: a container port with a hostPort reaches
// the runtime as a port mapping of the sandbox, which the runtime's CNI
// portmap plugin makes: the node's address at the host port answers with
// what the container serves.
func TestVirtualNodeCRIHostPort(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-port")
	hostIP := globalIPv4(t)
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)
	ns := createNamespace(t, c, "vncri-port")
	hostPort := int32(freePort(t)) //nolint:gosec // a port number
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": name},
			Tolerations:  []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "web", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", `mkdir /www && echo "served by $(hostname)" > /www/index.html && exec httpd -f -p 80 -h /www`},
				Ports:   []corev1.ContainerPort{{ContainerPort: 80, HostPort: hostPort}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "web", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	url := fmt.Sprintf("http://%s/index.html", net.JoinHostPort(hostIP, strconv.Itoa(int(hostPort))))
	if body := pollHTTP(t, ctx, "GET "+url+" through the host port", url); body != "served by web\n" {
		t.Errorf("through the host port: %q, want the pod's page", body)
	}
}

// globalIPv4 is an IPv4 address of the host other than loopback: one
// that the portmap plugin's DNAT rules match for connections from the
// host itself.
func globalIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() && !strings.HasPrefix(n.IP.String(), "10.250.") {
			return n.IP.String()
		}
	}
	t.Fatal("the host has no global IPv4 address to reach a host port at")
	return ""
}

// TestVirtualNodeCRISubPathEscape is the attacker's pod of
// CVE-2017-1002101's class on dpkit node --backend cri with containerd: an
// init container plants `ln -s / /vol/x` in an emptyDir, and the next
// container mounts the volume with subPath x. It is not started
// (CreateContainerConfigError, the subPath named as not within the
// volume), where containerd would have bind-mounted the node's / into it;
// a subPath that stays in the volume works, through the bind mount the
// node makes of the opened directory.
func TestVirtualNodeCRISubPathEscape(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-sub")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)
	ns := createNamespace(t, c, "vncri-sub")
	pod := func(podName, sub, script string) *corev1.Pod {
		p := criPod(ns, podName, name, script)
		p.Spec.Volumes = []corev1.Volume{{Name: "vol", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.InitContainers = []corev1.Container{{
			Name: "plant", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"sh", "-c", "ln -s / /vol/x && mkdir -p /vol/ok && echo fine > /vol/ok/f"},
			VolumeMounts: []corev1.VolumeMount{{Name: "vol", MountPath: "/vol"}},
		}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "vol", MountPath: "/mnt", SubPath: sub}}
		return p
	}
	for _, p := range []*corev1.Pod{
		pod("escape", "x", "ls /mnt/etc/passwd && echo ESCAPED; sleep 1"),
		pod("inside", "ok", "cat /mnt/f"),
	} {
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				describePod(t, c, ns, p.Name)
			}
			deletePodAndWait(t, c, ns, p.Name)
		})
	}
	refused := waitPod(t, ctx, c, ns, "escape", "its container refused", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	msg := refused.Status.ContainerStatuses[0].State.Waiting.Message
	if !strings.Contains(msg, `failed to prepare subPath for volumeMount "vol" of container "app"`) || !strings.Contains(msg, "not within volume path") {
		t.Errorf("refusal message %q, want the subPath named as not within the volume", msg)
	}
	waitPod(t, ctx, c, ns, "inside", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	b, err := c.CoreV1().Pods(ns).GetLogs("inside", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil || strings.TrimSpace(string(b)) != "fine" {
		t.Errorf("the subPath within the volume: log %q (%v), want fine", b, err)
	}
	if b, err := c.CoreV1().Pods(ns).GetLogs("escape", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx); err == nil && strings.Contains(string(b), "ESCAPED") {
		t.Errorf("the attacker's container ran with the node's / mounted: %s", b)
	}
}
