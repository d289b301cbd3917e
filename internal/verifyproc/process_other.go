//go:build !linux

package verifyproc

import (
	"errors"
	"os/exec"
	"syscall"
)

// parentDeathSignal: only Linux has the kernel signal a process when its
// parent dies.
func parentDeathSignal(*syscall.SysProcAttr) {}

func startInPrivateMount(*exec.Cmd, string, string) error {
	return errors.New("a private mount needs Linux mount namespaces")
}

// listeningSockets is known only on Linux.
func listeningSockets(int) ([]string, bool) { return nil, false }
