// Command pause is the test node's pod sandbox process, the Go equivalent
// of Kubernetes' build/pause/linux/pause.c: it holds the pod's namespaces,
// reaps the zombies of a pod that shares its PID namespace, and exits 0 on
// SIGINT or SIGTERM. test/controlplane packs it, static, into the node's
// sandbox image, so no pause image is pulled.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
			os.Exit(0)
		}
		// Reap every child that has exited: one SIGCHLD may stand for several.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
