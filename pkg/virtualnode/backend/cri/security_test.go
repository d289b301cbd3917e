package cri

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// TestSecurityFieldsPassed: seccomp, AppArmor and SELinux reach the
// runtime as the kubelet passes them (the container's over the pod's, a
// Localhost seccomp profile below the seccomp directory, Unconfined when
// none is asked for), for the sandbox and the container.
func TestSecurityFieldsPassed(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	defer b.Close()
	pod := testPod("secure", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent,
		SecurityContext: &corev1.SecurityContext{
			SeccompProfile:  &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptrTo("profiles/../../audit.json")},
			AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptrTo("k8s-deny-write")},
			SELinuxOptions:  &corev1.SELinuxOptions{Type: "container_t", Level: "s0:c1,c2"},
		},
	})
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		SeccompProfile:  &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeRuntimeDefault},
		SELinuxOptions:  &corev1.SELinuxOptions{User: "system_u", Level: "s0:c9"},
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	cfg := f.running("app")
	if cfg == nil {
		t.Fatal("no running container")
	}
	sc := cfg.Linux.SecurityContext
	wantProfile := filepath.Join(filepath.Dir(b.cfg.PodDir), "seccomp", "audit.json")
	if sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_Localhost || sc.Seccomp.GetLocalhostRef() != wantProfile {
		t.Errorf("container seccomp %v, want Localhost %s (the profile cannot climb out of the directory)", sc.Seccomp, wantProfile)
	}
	if sc.Apparmor.GetProfileType() != runtimeapi.SecurityProfile_Localhost || sc.Apparmor.GetLocalhostRef() != "k8s-deny-write" {
		t.Errorf("container AppArmor %v, want Localhost k8s-deny-write", sc.Apparmor)
	}
	if o := sc.SelinuxOptions; o.GetType() != "container_t" || o.GetLevel() != "s0:c1,c2" || o.GetUser() != "" {
		t.Errorf("container SELinux %v, want the container's options", o)
	}
	f.mu.Lock()
	var sandbox *runtimeapi.PodSandboxConfig
	for _, s := range f.sandboxes {
		sandbox = s.cfg
	}
	f.mu.Unlock()
	ssc := sandbox.GetLinux().GetSecurityContext()
	if ssc.GetSeccomp().GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault || ssc.GetSelinuxOptions().GetUser() != "system_u" {
		t.Errorf("sandbox security %v, want the pod's RuntimeDefault seccomp and SELinux", ssc)
	}
	if got := b.seccomp(nil, nil); got.GetProfileType() != runtimeapi.SecurityProfile_Unconfined {
		t.Errorf("no profile asked for: %v, want Unconfined (the kubelet's default)", got)
	}
}

// TestSecurityFieldsRefused: what the node cannot give a pod never runs
// without it: runAsNonRoot with an image that runs as root fails the
// container with the kubelet's message (CreateContainerConfigError), and
// another runtime class or a user namespace keeps the sandbox from being
// created, with the field and the fix in the message.
func TestSecurityFieldsRefused(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	defer b.Close()
	root := testPod("rootimage", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
	root.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptrTo(true)}
	explicit := testPod("uid0", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent,
		SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptrTo(true), RunAsUser: ptrTo(int64(0))}})
	fine := testPod("uid1000", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent,
		SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptrTo(true), RunAsUser: ptrTo(int64(1000))}})
	gvisor := testPod("gvisor", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
	gvisor.Spec.RuntimeClassName = ptrTo("gvisor")
	userns := testPod("userns", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
	userns.Spec.HostUsers = ptrTo(false)
	for _, p := range []*corev1.Pod{root, explicit, fine, gvisor, userns} {
		if err := b.CreatePod(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		pod         *corev1.Pod
		reason, msg string
	}{
		{root, "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"},
		{explicit, "CreateContainerConfigError", "container's runAsUser breaks non-root policy"},
		{gvisor, "ContainerCreating", "spec.runtimeClassName \"gvisor\""},
		{userns, "ContainerCreating", "spec.hostUsers: false"},
	} {
		p := rec.wait(t, tc.pod.UID, "waiting with "+tc.reason, func(p *corev1.Pod) bool {
			w := p.Status.ContainerStatuses[0].State.Waiting
			return w != nil && w.Reason == tc.reason && strings.Contains(w.Message, tc.msg)
		})
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s: phase %s, want Pending", tc.pod.Name, p.Status.Phase)
		}
	}
	rec.wait(t, fine.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if name := c.cfg.Metadata.Name; c.sandbox != "" && name == "app" {
			for _, s := range f.sandboxes {
				if s.id == c.sandbox && s.cfg.Metadata.Name != "uid1000" {
					t.Errorf("a container of refused pod %s was created", s.cfg.Metadata.Name)
				}
			}
		}
	}
}
