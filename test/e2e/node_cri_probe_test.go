package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// TestVirtualNodeCRIProbes: `dpkit node --backend cri` on a containerd
// of its own runs a pod's probes and hooks in its container: the
// postStart hook has run once the container runs; the pod is Ready only
// once its exec readiness probe passes (the file it reads made through
// kubectl exec); a failing liveness probe restarts the container, with
// the kubelet's Unhealthy and Killing events, and the new container is
// not ready until its file is there again. A web server's httpGet
// readiness probe reaches it at its pod IP (404, then 200) and its
// tcpSocket liveness probe keeps passing.
func TestVirtualNodeCRIProbes(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncriprobe")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)

	ns := createNamespace(t, c, "vncriprobe")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probed", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": name},
			Tolerations:                   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr(int64(10)),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", `trap "exit 0" TERM; sleep 3600 & wait`},
				Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
					Command: []string{"sh", "-c", "echo hooked > /tmp/poststart"},
				}}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "! cat /tmp/sick"}}},
					PeriodSeconds: 1, FailureThreshold: 1, TerminationGracePeriodSeconds: ptr(int64(2)),
				},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A web server in the pod's network: its httpGet readiness probe
	// reaches it at the pod IP, its tcpSocket liveness probe passes.
	web := pod.DeepCopy()
	web.Name = "web"
	web.Spec.Containers[0].Lifecycle = nil
	web.Spec.Containers[0].Command = []string{"sh", "-c", "mkdir -p /tmp/www && exec httpd -f -p 8080 -h /tmp/www"}
	web.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	web.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http"), Path: "/ok"}},
		PeriodSeconds: 1, FailureThreshold: 1,
	}
	web.Spec.Containers[0].LivenessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 1,
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, ctx, c, ns, "probed", "Running on "+name, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if cs := running.Status.ContainerStatuses[0]; cs.Ready || podReady(running) {
		t.Errorf("ready before its readiness probe passed: container ready %v, conditions %+v", cs.Ready, running.Status.Conditions)
	}
	out, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, "probed", []string{"cat", "/tmp/poststart"}, "")
	if err != nil || out != "hooked\n" {
		t.Errorf("the postStart hook's file: %q %q %v, want hooked", out, errOut, err)
	}

	// The readiness probe passes once the file exists.
	if _, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, "probed", []string{"touch", "/tmp/ready"}, ""); err != nil {
		t.Fatalf("touch /tmp/ready: %v %s", err, errOut)
	}
	waitPod(t, ctx, c, ns, "probed", "Ready", func(p *corev1.Pod) bool {
		return podReady(p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
	})

	// The liveness probe fails: the container is killed and restarted,
	// not ready until its (new) file exists.
	if _, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, "probed", []string{"sh", "-c", "echo too bad > /tmp/sick"}, ""); err != nil {
		t.Fatalf("making the container sick: %v %s", err, errOut)
	}
	restarted := waitPod(t, ctx, c, ns, "probed", "restarted after its liveness probe failed", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == 1 && cs[0].State.Running != nil
	})
	if cs := restarted.Status.ContainerStatuses[0]; cs.ContainerID == running.Status.ContainerStatuses[0].ContainerID || cs.LastTerminationState.Terminated == nil {
		t.Errorf("restarted container %+v, want a new one with the killed one's termination", cs)
	}
	waitPod(t, ctx, c, ns, "probed", "not ready in its new container", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == 1 && !cs[0].Ready && !podReady(p)
	})
	poll(t, ctx, "the kubelet's Unhealthy and Killing events about the container", func(ctx context.Context) (bool, string, error) {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "probed").String()})
		if err != nil {
			return false, "", err
		}
		var seen []string
		unhealthy, killing := false, false
		for _, e := range evs.Items {
			seen = append(seen, fmt.Sprintf("%s %s %s: %s", e.InvolvedObject.FieldPath, e.Type, e.Reason, e.Message))
			if e.InvolvedObject.FieldPath != "spec.containers{app}" {
				continue
			}
			switch {
			case e.Reason == "Unhealthy" && e.Type == corev1.EventTypeWarning && strings.HasPrefix(e.Message, "Liveness probe failed: too bad"):
				unhealthy = true
			case e.Reason == "Killing" && e.Message == "Container app failed liveness probe, will be restarted":
				killing = true
			}
		}
		return unhealthy && killing, strings.Join(seen, "\n"), nil
	})

	// The web pod: not ready while /ok is missing (the Unhealthy event
	// has httpd's 404), ready once it is there, never restarted.
	waitPod(t, ctx, c, ns, "web", "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if ev := waitEvent(t, ctx, c, ns, "web", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 404"); ev.InvolvedObject.FieldPath != "spec.containers{app}" {
		t.Errorf("Unhealthy event about %q, want spec.containers{app}", ev.InvolvedObject.FieldPath)
	}
	if _, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, "web", []string{"touch", "/tmp/www/ok"}, ""); err != nil {
		t.Fatalf("touch /tmp/www/ok: %v %s", err, errOut)
	}
	ready := waitPod(t, ctx, c, ns, "web", "Ready", func(p *corev1.Pod) bool { return podReady(p) })
	if cs := ready.Status.ContainerStatuses[0]; cs.RestartCount != 0 {
		t.Errorf("web restarted %d times: its tcpSocket liveness probe failed", cs.RestartCount)
	}
}
