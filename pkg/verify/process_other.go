//go:build !linux

package verify

import (
	"errors"
	"os/exec"
)

func startInPrivateMount(*exec.Cmd, string, string) error {
	return errors.New("--private-mount needs Linux mount namespaces")
}

// listeningSockets is known only on Linux.
func listeningSockets(int) ([]string, bool) { return nil, false }
