package verify

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// startInPrivateMount starts cmd in a new mount namespace in which dst is
// a bind mount of src. The mounts are made on a locked OS thread that
// first unshares its own mount namespace, so the verifier's namespace is
// never touched; the thread is discarded afterwards (the goroutine exits
// while locked). The child gets a copy of that namespace (CLONE_NEWNS).
func startInPrivateMount(cmd *exec.Cmd, src, dst string) error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		errc <- func() error {
			if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			// Keep the mounts below out of the host's namespace.
			if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			if err := os.MkdirAll(dst, 0o750); err != nil {
				return fmt.Errorf("create %s: %w", dst, err)
			}
			if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind-mount %s on %s: %w", src, dst, err)
			}
			cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNS
			return cmd.Start()
		}()
	}()
	return <-errc
}
