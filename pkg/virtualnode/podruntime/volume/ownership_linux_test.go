package volume

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGroupTreeFollowsNoLink: the fsGroup walk gives the tree's files and
// directories the group and mask, and a link planted in the tree (to a
// file or a directory elsewhere on the node) only its own group: nothing
// it points to is changed or walked into.
func TestGroupTreeFollowsNoLink(t *testing.T) {
	t.Parallel()
	gid := os.Getgid()
	if os.Geteuid() == 0 {
		gid = 4343
	}
	root := t.TempDir()
	outside := filepath.Join(root, "node")
	if err := os.MkdirAll(filepath.Join(outside, "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(outside, "etc", "shadow")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(root, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "sub", "data"), []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"to-file": secret, "to-dir": outside, "sub/to-etc": filepath.Join(outside, "etc")} {
		if err := os.Symlink(target, filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]syscall.Stat_t{}
	for _, p := range []string{outside, filepath.Join(outside, "etc"), secret} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		before[p] = st
	}
	if err := groupTree(vol, gid, rwMask); err != nil {
		t.Fatal(err)
	}
	for p, was := range before {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != was.Gid || st.Mode != was.Mode {
			t.Errorf("%s outside the volume changed: gid %d mode %o, was gid %d mode %o", p, st.Gid, st.Mode, was.Gid, was.Mode)
		}
	}
	for p, want := range map[string]fs.FileMode{
		vol:                               fs.ModeDir | fs.ModeSetgid | 0o770,
		filepath.Join(vol, "sub"):         fs.ModeDir | fs.ModeSetgid | 0o770,
		filepath.Join(vol, "sub", "data"): 0o660,
	} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want || int(fi.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Errorf("%s: mode %v gid %d, want %v gid %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid, want, gid)
		}
	}
	for _, l := range []string{"to-file", "to-dir", "sub/to-etc"} {
		fi, err := os.Lstat(filepath.Join(vol, l))
		if err != nil {
			t.Fatal(err)
		}
		if int(fi.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Errorf("link %s: gid %d, want %d (a link gets the group)", l, fi.Sys().(*syscall.Stat_t).Gid, gid)
		}
	}
	if err := groupTree(filepath.Join(vol, "to-dir"), gid, rwMask); err == nil {
		t.Error("groupTree of a link to a directory: no error, want it refused")
	}
}

// TestGroupTreeSwapRace: the pod swaps a file, and a directory, for links
// to the node's files right after the walk checked them and before it
// changes them (the window of CVE-2021-25741's class): nothing outside
// the volume is changed or walked into.
func TestGroupTreeSwapRace(t *testing.T) {
	t.Parallel()
	gid := os.Getgid()
	if os.Geteuid() == 0 {
		gid = 4344
	}
	root := t.TempDir()
	outside := filepath.Join(root, "node")
	if err := os.MkdirAll(filepath.Join(outside, "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(outside, "etc", "shadow")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(root, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "file"), []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	swaps := map[string]string{filepath.Join(vol, "file"): secret, filepath.Join(vol, "dir"): filepath.Join(outside, "etc")}
	swap := func(path string) {
		target, ok := swaps[path]
		if !ok {
			return
		}
		delete(swaps, path)
		if err := os.Rename(path, path+".moved"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Error(err)
		}
	}
	stat := func(p string) syscall.Stat_t {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	before := map[string]syscall.Stat_t{secret: stat(secret), filepath.Join(outside, "etc"): stat(filepath.Join(outside, "etc"))}
	err := walkGroup(vol, gid, rwMask, swap)
	t.Logf("walk: %v", err)
	if len(swaps) != 0 {
		t.Fatalf("entries never offered to swap: %v", swaps)
	}
	for p, was := range before {
		if st := stat(p); st.Gid != was.Gid || st.Mode != was.Mode {
			t.Errorf("%s outside the volume changed by the walk: gid %d mode %o, was gid %d mode %o", p, st.Gid, st.Mode, was.Gid, was.Mode)
		}
	}
}

// TestEmptyDirOwnershipOnce: an emptyDir gets its mode and fsGroup when it
// is set up, as the kubelet's (its ready marker), and is not walked again
// at the next volume sync while the pod writes it.
func TestEmptyDirOwnershipOnce(t *testing.T) {
	t.Parallel()
	gid := int64(os.Getgid())
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "once", UID: "uid"}}
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &gid}
	vol := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	m := New(pod, Config{Dir: t.TempDir()})
	hv, err := m.setupVolume(context.Background(), vol)
	if err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(hv.path, "private")
	if err := os.WriteFile(written, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.setupVolume(context.Background(), vol); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(written); err != nil || fi.Mode() != 0o600 {
		t.Errorf("a file the pod wrote after set-up: %v %v, want 0600 left alone", fi.Mode(), err)
	}
}
