//go:build !linux

package upstream

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
