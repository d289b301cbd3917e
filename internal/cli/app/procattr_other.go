//go:build !linux

package app

import "syscall"

func clusterProcAttr() *syscall.SysProcAttr { return nil }
