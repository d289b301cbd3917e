package app

import "syscall"

// clusterProcAttr has the kernel send dpkit-cluster SIGTERM if dpkit dies
// without passing a signal on (SIGKILL), so that it does not run on alone.
func clusterProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
