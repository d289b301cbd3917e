package controlplane

import "syscall"

// sysProcAttr asks the kernel to kill the control plane's processes if the
// test binary dies without calling Stop, so none outlive a crashed test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
