package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/test/controlplane"
)

// cluster is one control plane (with kube-scheduler) shared by this
// package's tests; it starts on first use, so -short never starts it. Tests
// that share it use their own namespaces, node and resource names.
var cluster = controlplane.NewShared(controlplane.Options{Scheduler: true})

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop shared control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	if err := realNode.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the real node and its control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	cleanupBinaries()
	dratest.RemoveBinary()
	os.Exit(code)
}
