package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// containerView is what a container sees that the side-by-side test
// compares: its environment, its device nodes and its mount points.
type containerView struct {
	env, devices, mounts []string
}

// viewScript prints a containerView between markers, then waits.
const viewScript = `echo '--env'; env | sort; echo '--dev'; ls -l /dev | grep '^[bc]' | awk '{print $1, $5, $6, $NF}'; ` +
	`echo '--mounts'; awk '{print $2}' /proc/mounts | sort -u; echo '--end'; trap "exit 0" TERM; sleep 3600 & wait`

// ignoredEnv are variables that differ by node: the host name (the pod's
// name on both, set by different parts) and the API server's Service
// variables. HOME is compared: runc sets it from the image's /etc/passwd,
// and both runtimes have the same image (controlplane.BaseImages).
func ignoredEnv(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	return name == "HOSTNAME" || strings.HasPrefix(name, "KUBERNETES_")
}

func parseView(t *testing.T, logs string) containerView {
	t.Helper()
	var v containerView
	var cur *[]string
	for line := range strings.SplitSeq(logs, "\n") {
		switch line {
		case "--env":
			cur = &v.env
		case "--dev":
			cur = &v.devices
		case "--mounts":
			cur = &v.mounts
		case "--end", "":
			cur = nil
		default:
			if cur != nil {
				*cur = append(*cur, line)
			}
		}
	}
	v.env = slices.DeleteFunc(v.env, ignoredEnv)
	return v
}

// viewPod is the one manifest both nodes run, but for the node it is
// pinned to.
func viewPod(ns, name, node string, res corev1.ResourceName) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			Tolerations:                   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr(int64(5)),
			EnableServiceLinks:            ptr(false),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:    []string{"sh", "-c", viewScript},
				Env:        []corev1.EnvVar{{Name: "FROM_POD", Value: "a value"}, {Name: "EXPANDED", Value: "$(FROM_POD) expanded"}},
				WorkingDir: "/tmp",
				Resources:  corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}},
			}},
		},
	}
}

func runView(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, node string, res corev1.ResourceName) containerView {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Create(ctx, viewPod(ns, name, node, res), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, name)
		}
		deletePodAndWait(t, c, ns, name)
	})
	var logs string
	poll(t, ctx, "what pod "+name+" sees, from its log", func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, "--end"), logs, nil
	})
	return parseView(t, logs)
}

// TestCRISideBySideWithKubelet runs one pod manifest on the real node
// (kubelet v1.37 with containerd) and on `dpkit node --backend cri` (a
// containerd of its own: a kubelet removes every sandbox of its runtime it
// did not create), both with the generic plugin serving /dev/zero as
// /dev/dpkit-zero with a variable. The containers see the same
// environment (but ignoredEnv), the same device nodes, and the same mount
// points (/proc and /sys masked and read-only alike). Then pods asking
// for seccomp, AppArmor (refused where the host has none), runAsNonRoot
// with an image that runs as root, and a subPath end the same way on both.
func TestCRISideBySideWithKubelet(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	const res = "e2e.dpkit.io/zero-side"

	// The kubelet's side: the plugin DaemonSet on the real node only.
	d := deployOverlay(t, "generic", res, zeroConfig(res), `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: dpkit-plugin
spec:
  template:
    spec:
      nodeSelector:
        kubernetes.io/hostname: `+n.Name+`
`)
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")

	// dpkit's side: a cri-backed node with the same plugin in process.
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	vn := unique("vncri-side")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, vn, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)
	cfg := filepath.Join(root, "plugin.yaml")
	writeFile(t, cfg, "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- generic:\n"+indent(zeroConfig(res), "    "))
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out, logs bytes.Buffer
		done <- app.Run(pctx, []string{"plugin", "--config", cfg, "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &logs)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitAllocatable(t, ctx, c, vn, corev1.ResourceName(res), "2")

	ns := createNamespace(t, c, "cri-side")
	kubelet := runView(t, ctx, c, ns, "kubelet", n.Name, res)
	dpkit := runView(t, ctx, c, ns, "dpkit", vn, res)
	t.Logf("kubelet: %+v", kubelet)
	t.Logf("dpkit:   %+v", dpkit)

	if !slices.Equal(kubelet.env, dpkit.env) {
		t.Errorf("environment differs:\nkubelet %q\ndpkit   %q", kubelet.env, dpkit.env)
	}
	if !slices.Contains(dpkit.env, "HOME=/root") {
		t.Errorf("dpkit's container has no HOME=/root, root's home in the image's /etc/passwd: %q", dpkit.env)
	}
	if !slices.Equal(kubelet.devices, dpkit.devices) {
		t.Errorf("device nodes differ:\nkubelet %q\ndpkit   %q", kubelet.devices, dpkit.devices)
	}
	if !slices.Contains(dpkit.devices, "crw-rw-rw- 1, 5 dpkit-zero") {
		t.Errorf("dpkit's container has no /dev/dpkit-zero (1, 5): %q", dpkit.devices)
	}
	onlyKubelet := slices.DeleteFunc(slices.Clone(kubelet.mounts), func(m string) bool { return slices.Contains(dpkit.mounts, m) })
	onlyDpkit := slices.DeleteFunc(slices.Clone(dpkit.mounts), func(m string) bool { return slices.Contains(kubelet.mounts, m) })
	if len(onlyDpkit) > 0 {
		t.Errorf("mount points only dpkit's container has: %q", onlyDpkit)
	}
	// The termination log, /etc/hosts, /etc/hostname and /etc/resolv.conf
	// included: the cri backend mounts the first two; the runtime mounts
	// the others since the backend gives the sandbox the pod's DNS
	// configuration and /etc/hosts (before, it mounted none of the four).
	if len(onlyKubelet) > 0 {
		t.Errorf("mount points only the kubelet's container has: %q", onlyKubelet)
	}

	// Security fields: the same outcome on both nodes.
	for _, sp := range securityPods() {
		k := securityOutcome(t, ctx, c, ns, "k-"+sp.name, n.Name, res, sp.edit)
		v := securityOutcome(t, ctx, c, ns, "v-"+sp.name, vn, res, sp.edit)
		t.Logf("%s: kubelet %q, dpkit %q", sp.name, k, v)
		if k != v {
			t.Errorf("%s: the kubelet's pod %q, dpkit's %q", sp.name, k, v)
		}
	}
}

// securityPod is a change to the view pod that asks for a security
// feature.
type securityPod struct {
	name string
	edit func(*corev1.Pod)
}

func securityPods() []securityPod {
	return []securityPod{
		{"seccomp", func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		}},
		{"apparmor", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeRuntimeDefault}}
		}},
		{"nonroot", func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}
		}},
		{"subpath", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/data", SubPath: "sub/dir"}}
		}},
	}
}

// securityOutcome runs the view pod, changed by edit, on node and returns
// how it ended up: running (with /data listed among its mounts when it
// has it), failed with its reason and message, or waiting with its
// reason and message (the pod's own name cut from it).
func securityOutcome(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, node string, res corev1.ResourceName, edit func(*corev1.Pod)) string {
	t.Helper()
	p := viewPod(ns, name, node, res)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	edit(p)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePodAndWait(t, c, ns, name) })
	var out string
	waitPod(t, ctx, c, ns, name, "running, failed or waiting for a reason", func(p *corev1.Pod) bool {
		switch p.Status.Phase {
		case corev1.PodFailed:
			out = "Failed " + p.Status.Reason + ": " + p.Status.Message
			return true
		case corev1.PodRunning:
			out = "Running"
			return true
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				msg, _, _ := strings.Cut(w.Message, " (pod: ")
				out = "Waiting " + w.Reason + ": " + msg
				return true
			}
		}
		return false
	})
	if out == "Running" {
		var logs string
		poll(t, ctx, "what pod "+name+" sees", func(ctx context.Context) (bool, string, error) {
			b, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
			logs = string(b)
			return err == nil && strings.Contains(logs, "--end"), logs, nil
		})
		if slices.Contains(parseView(t, logs).mounts, "/data") {
			out += " with /data"
		}
	}
	return out
}
