package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/test/controlplane"
)

// TestVirtualNodeCRIAttacks is the attack suite of `dpkit node --backend
// cri` (docs/security.md, "The attack suite"): each subtest is the
// attacker's pod, and checks that what it aims at stays out of its reach.
// The subPath escape (TestVirtualNodeCRISubPathEscape), the dropped
// security fields (TestCRISideBySideWithKubelet) and the admission bypass
// (TestVirtualNodeAdmissionPredicates) have tests of their own.
func TestVirtualNodeCRIAttacks(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-atk")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	// Volumes written again every second, so that the fsGroup attack
	// sees many passes.
	o.SyncFrequency = time.Second
	_, stop := runNode(t, ctx, o)
	ns := createNamespace(t, c, "vncri-atk")
	create := func(t *testing.T, p *corev1.Pod) *corev1.Pod {
		t.Helper()
		created, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				describePod(t, c, ns, p.Name)
			}
		})
		return created
	}

	// A container that writes 64 MiB to its termination message file:
	// the message is its last 4 KiB, as the kubelet's.
	t.Run("termination-message-flood", func(t *testing.T) {
		p := create(t, criPod(ns, "flood", name, "tr '\\0' A </dev/zero | head -c 67108864 >/dev/termination-log; exit 1"))
		end := waitPod(t, ctx, c, ns, p.Name, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		term := end.Status.ContainerStatuses[0].State.Terminated
		if term == nil || len(term.Message) != 4096 || strings.Trim(term.Message, "A") != "" {
			t.Errorf("termination state %+v: want a message of 4096 A's", term)
		}
	})

	// The pod's own volume mounted at terminationMessagePath, through a
	// link planted to a node file: the container is refused, and no node
	// file reaches the status.
	t.Run("termination-message-link", func(t *testing.T) {
		p := criPod(ns, "msglink", name, "exit 1")
		p.Spec.Volumes = []corev1.Volume{{Name: "vol", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.InitContainers = []corev1.Container{{
			Name: "plant", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"ln", "-s", "/etc/hostname", "/vol/msg"},
			VolumeMounts: []corev1.VolumeMount{{Name: "vol", MountPath: "/vol"}},
		}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "vol", MountPath: "/dev/termination-log", SubPath: "msg"}}
		create(t, p)
		refused := waitPod(t, ctx, c, ns, p.Name, "its container refused", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerConfigError"
		})
		host, _ := os.ReadFile("/etc/hostname")
		if msg := refused.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "not within volume path") {
			t.Errorf("refusal %q, want the subPath named as not within the volume", msg)
		} else if h := strings.TrimSpace(string(host)); h != "" && strings.Contains(msg, h) {
			t.Errorf("refusal %q carries the node's /etc/hostname", msg)
		}
	})

	// A container in a crash loop, each run writing its termination
	// message: the node keeps the files of the current and the previous
	// run, not one a restart.
	t.Run("termination-files-per-restart", func(t *testing.T) {
		p := criPod(ns, "loop", name, "echo run >/dev/termination-log; exit 1")
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		p = create(t, p)
		waitPod(t, ctx, c, ns, p.Name, "restarted 3 times", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].RestartCount >= 3
		})
		files, err := os.ReadDir(filepath.Join(root, "pods", string(p.UID), "containers", "app"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) > 2 {
			t.Errorf("%d termination message files after 3 restarts, want at most 2", len(files))
		}
	})

	// fsGroup ownership and a link the pod puts in its emptyDir to a node
	// directory and a node file: while the node writes the pod's volumes
	// again (every second here), neither gets the pod's group or g+rw.
	t.Run("fsgroup-link", func(t *testing.T) {
		victim := filepath.Join(testdir.Short(t, "vn"), "victim")
		if err := os.Mkdir(victim, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(victim, "file"), []byte("node"), 0o600); err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pass", Namespace: ns}, Data: map[string]string{"k": "v1"}}
		if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("ln -s %[1]s /vol/dir && ln -s %[1]s/file /vol/file && echo planted && "+
			"until grep -q v2 /cm/k; do sleep 0.1; done && echo v2 && until grep -q v3 /cm/k; do sleep 0.1; done && echo v3 && sleep 3600", victim)
		p := criPod(ns, "fsgroup", name, script)
		p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr(int64(4321))}
		p.Spec.Volumes = []corev1.Volume{
			{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "pass"}}}},
			{Name: "vol", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cm", MountPath: "/cm"}, {Name: "vol", MountPath: "/vol"}}
		create(t, p)
		// Two volume passes after the links are planted: v2 is written in
		// one, v3 in a later one, each pass going over every volume.
		waitLog(t, ctx, c, ns, p.Name, "planted")
		for _, v := range []string{"v2", "v3"} {
			cm.Data["k"] = v
			if _, err := c.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitLog(t, ctx, c, ns, p.Name, v)
		}
		for _, path := range []string{victim, filepath.Join(victim, "file")} {
			var st syscall.Stat_t
			if err := syscall.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			if st.Gid == 4321 || st.Mode&0o060 != 0 {
				t.Errorf("%s: gid %d mode %o: the pod's fsGroup reached a node path through its link", path, st.Gid, st.Mode&0o7777)
			}
		}
	})

	// A pod deleted while its node is down, its sandbox gone with the
	// runtime's state: the restarted node unmounts the Secret tmpfs the
	// pod left and removes its directories.
	t.Run("orphaned-pod-directory", func(t *testing.T) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token", Namespace: ns}, StringData: map[string]string{"t": "secret"}}
		if _, err := c.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := criPod(ns, "orphan", name, "sleep 3600")
		p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "token"}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "s", MountPath: "/s"}}
		p = create(t, p)
		waitPod(t, ctx, c, ns, p.Name, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		podDir := filepath.Join(root, "pods", string(p.UID))
		if mounts := mountsUnder(t, podDir); len(mounts) == 0 {
			t.Fatalf("no tmpfs under %s while the pod runs", podDir)
		}
		stop()
		if err := c.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatal(err)
		}
		removeSandboxes(t, ctx, rtm, string(p.UID))
		runNode(t, ctx, o)
		poll(t, ctx, "the orphan's tmpfs unmounted and its directories removed", func(context.Context) (bool, string, error) {
			mounts := mountsUnder(t, podDir)
			dirs, _ := filepath.Glob(filepath.Join(root, "pods", "*"+string(p.UID)))
			return len(mounts) == 0 && len(dirs) == 0, fmt.Sprintf("mounts %v, directories %v", mounts, dirs), nil
		})
	})
}

// waitLog waits until the app container's log of pod holds line.
func waitLog(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, pod, line string) {
	t.Helper()
	poll(t, ctx, fmt.Sprintf("pod %s logging %q", pod, line), func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			if l == line {
				return true, "", nil
			}
		}
		return false, string(b), nil
	})
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := procfs.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	return out
}

// removeSandboxes stops and removes the sandboxes of the pod with uid, as
// a runtime whose state was lost would have none.
func removeSandboxes(t *testing.T, ctx context.Context, rtm *criRuntime, uid string) {
	t.Helper()
	sbs, err := rtm.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs.Items {
		if sb.Metadata.GetUid() != uid {
			continue
		}
		if _, err := rtm.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Fatal(err)
		}
		if _, err := rtm.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Fatal(err)
		}
	}
}
