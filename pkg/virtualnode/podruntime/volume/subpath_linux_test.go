package volume

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOpenSubPath: a subPath is opened within its volume only. Links the
// pod planted that lead out of the volume (the whole subPath, a component
// in the middle, the parent of a directory to make) are refused, and
// nothing is made outside; links within the volume are followed, as the
// kubelet does; missing directories are made with the volume's mode.
func TestOpenSubPath(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	other := filepath.Join(root, "node")
	if err := os.MkdirAll(filepath.Join(other, "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(root, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "data", "in"), 0o777); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"escape":  other,            // the pod's `ln -s / /vol/escape`
		"up":      "../node",        // relative, out of the volume
		"inside":  "data/in",        // stays in the volume
		"data/up": "../../node/etc", // deeper, out again
	} {
		if err := os.Symlink(target, filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		sub     string
		refused bool
	}{
		{"data", false},
		{"inside", false},
		{"inside/new/deeper", false},
		{"escape", true},
		{"escape/etc", true},
		{"escape/new", true},
		{"up", true},
		{"data/up", true},
		{"data/up/made", true},
	} {
		fd, err := openSubPath(vol, tc.sub, 0o755)
		if fd >= 0 {
			syscall.Close(fd)
		}
		switch {
		case tc.refused && (err == nil || !strings.Contains(err.Error(), "not within volume path")):
			t.Errorf("subPath %q: %v, want refused as not within the volume", tc.sub, err)
		case !tc.refused && err != nil:
			t.Errorf("subPath %q: %v, want it opened", tc.sub, err)
		}
	}
	for _, p := range []string{filepath.Join(other, "new"), filepath.Join(other, "etc", "made")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was made outside the volume", p)
		}
	}
	if st, err := os.Stat(filepath.Join(vol, "data", "in", "new", "deeper")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
		t.Errorf("made subPath: %v %v, want a directory 0755", st, err)
	}
}

// TestBindSubPath: the opened subPath is bind-mounted at the target given
// to the runtime, which shows the opened inode even once the pod has
// swapped the path for a link; unmountSubPaths removes the mounts.
func TestBindSubPath(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root, as the kubelet's subPath")
	}
	root := t.TempDir()
	vol := filepath.Join(root, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "x", "mine"), []byte("pod data"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := openSubPath(vol, "x", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	// The pod swaps x for a link to the node's tree after it was opened.
	if err := os.Rename(filepath.Join(vol, "x"), filepath.Join(vol, "x.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(vol, "x")); err != nil {
		t.Fatal(err)
	}
	pod := filepath.Join(root, "pod")
	target := filepath.Join(pod, subPathDir, "v", "app", "0")
	err = bindSubPath(fd, target)
	syscall.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unmountSubPaths(pod) })
	if b, err := os.ReadFile(filepath.Join(target, "mine")); err != nil || string(b) != "pod data" {
		t.Errorf("target shows %q (%v), want the opened directory's file", b, err)
	}
	if _, err := os.Stat(filepath.Join(target, "passwd")); err == nil {
		t.Error("target shows the node's /etc")
	}
	if err := unmountSubPaths(pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), target) {
		t.Errorf("%s still mounted", target)
	}
}
