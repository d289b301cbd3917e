package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of size bytes (0: the kernel's default) at
// dir unless one is there already (a pod
// adopted after a restart), as the kubelet backs secret, projected and
// downwardAPI volumes and emptyDir{medium: Memory}: their files never
// reach the node's disk.
func mountTmpfs(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.TMPFS_MAGIC && isMountPoint(dir) {
		return nil
	}
	opts := "mode=0755"
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting a tmpfs at %s (secret, projected and downwardAPI volumes and emptyDir{medium: Memory} need root to mount, unless written to disk: cri.Config.DiskBackedVolumes): %w", dir, err)
	}
	return nil
}

// isMountPoint reports whether dir is on another device than its parent.
func isMountPoint(dir string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// unmountVolumes unmounts the subPath bind mounts and the tmpfs volumes
// under a pod's directory.
func unmountVolumes(podDir string) error {
	if err := unmountSubPaths(podDir); err != nil {
		return err
	}
	dirs, _ := filepath.Glob(filepath.Join(podDir, "volumes", "*", "*"))
	var errs []error
	for _, d := range dirs {
		if isMountPoint(d) {
			if err := unix.Unmount(d, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
