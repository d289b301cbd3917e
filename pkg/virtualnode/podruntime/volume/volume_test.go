package volume

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestHostPathTypes: the kubelet's hostPath type checks.
func TestHostPathTypes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		path string
		typ  corev1.HostPathType
		err  string
	}{
		{filepath.Join(dir, "absent"), corev1.HostPathUnset, ""},
		{dir, corev1.HostPathDirectory, ""},
		{file, corev1.HostPathDirectory, "hostPath type check failed: " + file + " is not a directory"},
		{filepath.Join(dir, "absent"), corev1.HostPathDirectory, "hostPath type check failed: " + filepath.Join(dir, "absent") + " is not a directory"},
		{filepath.Join(dir, "new/dir"), corev1.HostPathDirectoryOrCreate, ""},
		{file, corev1.HostPathDirectoryOrCreate, "hostPath type check failed: " + file + " is not a directory"},
		{file, corev1.HostPathFile, ""},
		{dir, corev1.HostPathFile, "hostPath type check failed: " + dir + " is not a file"},
		{filepath.Join(dir, "newfile"), corev1.HostPathFileOrCreate, ""},
		{dir, corev1.HostPathFileOrCreate, "hostPath type check failed: " + dir + " is not a file"},
		{sock, corev1.HostPathSocket, ""},
		{file, corev1.HostPathSocket, "hostPath type check failed: " + file + " is not a socket file"},
		{"/dev/null", corev1.HostPathCharDev, ""},
		{file, corev1.HostPathCharDev, "hostPath type check failed: " + file + " is not a character device"},
		{"/dev/null", corev1.HostPathBlockDev, "hostPath type check failed: /dev/null is not a block device"},
	} {
		err := checkHostPathType(tc.path, &tc.typ)
		if got := errString(err); got != tc.err {
			t.Errorf("%s %q: error %q, want %q", tc.path, tc.typ, got, tc.err)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "new/dir")); err != nil || !st.IsDir() {
		t.Errorf("DirectoryOrCreate made no directory: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, "newfile")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("FileOrCreate made no file: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestVolumeMountErrors: what makes a container's configuration fail, as
// the kubelet's makeMounts.
func TestVolumeMountErrors(t *testing.T) {
	t.Parallel()
	bidi := corev1.MountPropagationBidirectional
	m := &Manager{mounted: map[string]hostVolume{"v": {path: t.TempDir()}}}
	for _, tc := range []struct {
		name  string
		mount corev1.VolumeMount
		err   string
	}{
		{"unknown volume", corev1.VolumeMount{Name: "w", MountPath: "/w"}, `cannot find volume "w" to mount into container "app"`},
		{"subPath out of the volume", corev1.VolumeMount{Name: "v", MountPath: "/v", SubPath: "../etc"}, `subPath "../etc" of volume "v": must be a relative path within the volume`},
		{"bidirectional unprivileged", corev1.VolumeMount{Name: "v", MountPath: "/v", MountPropagation: &bidi}, "bidirectional mount propagation is available only to privileged containers"},
	} {
		_, err := m.Mounts(&corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{tc.mount}}, nil)
		if errString(err) != tc.err {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
	priv := true
	ms, err := m.Mounts(&corev1.Container{Name: "app", SecurityContext: &corev1.SecurityContext{Privileged: &priv},
		VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/v", MountPropagation: &bidi, ReadOnly: true}}}, nil)
	if err != nil || len(ms) != 1 || ms[0].Propagation != corev1.MountPropagationBidirectional || !ms[0].ReadOnly {
		t.Errorf("privileged bidirectional read-only: %v %v", ms, err)
	}
}

// TestTmpfsSize: the kubelet's calculateEmptyDirMemorySize.
func TestTmpfsSize(t *testing.T) {
	t.Parallel()
	mi := func(n int64) int64 { return n << 20 }
	limits := func(mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	always := corev1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name      string
		alloc     string
		init, app []corev1.Container
		overhead  string
		sizeLimit string
		want      int64
	}{
		{name: "no allocatable: the kernel's default", app: []corev1.Container{{Resources: limits("64Mi")}}, want: 0},
		{name: "no pod limit: allocatable", alloc: "1Gi", app: []corev1.Container{{}, {Resources: limits("64Mi")}}, want: mi(1024)},
		{name: "pod limit: app containers added", alloc: "1Gi", app: []corev1.Container{{Resources: limits("64Mi")}, {Resources: limits("32Mi")}}, want: mi(96)},
		{name: "a bigger init container", alloc: "1Gi", init: []corev1.Container{{Resources: limits("200Mi")}}, app: []corev1.Container{{Resources: limits("64Mi")}}, want: mi(200)},
		{name: "sidecars added, overhead too", alloc: "1Gi", overhead: "8Mi",
			init: []corev1.Container{{Resources: limits("16Mi"), RestartPolicy: &always}}, app: []corev1.Container{{Resources: limits("64Mi")}}, want: mi(88)},
		{name: "pod limit above allocatable", alloc: "64Mi", app: []corev1.Container{{Resources: limits("1Gi")}}, want: mi(64)},
		{name: "sizeLimit smaller", alloc: "1Gi", app: []corev1.Container{{Resources: limits("64Mi")}}, sizeLimit: "1Mi", want: mi(1)},
		{name: "sizeLimit larger than the pod's", alloc: "1Gi", app: []corev1.Container{{Resources: limits("64Mi")}}, sizeLimit: "128Mi", want: mi(64)},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.app}}
		if tc.overhead != "" {
			pod.Spec.Overhead = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.overhead)}
		}
		var alloc corev1.ResourceList
		if tc.alloc != "" {
			alloc = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.alloc)}
		}
		var sl *resource.Quantity
		if tc.sizeLimit != "" {
			q := resource.MustParse(tc.sizeLimit)
			sl = &q
		}
		if got := tmpfsSize(pod, alloc, sl); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
