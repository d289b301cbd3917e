package upstream

import "syscall"

// sysProcAttr asks the kernel to kill the process if the test binary dies
// first, so no plugin or kubelet outlives a crashed test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
