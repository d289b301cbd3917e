package differential

import (
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/test/upstream"
)

// TestDifferential runs every scenario against the kubelet's device
// manager (v1.37) and dpkit's, in parallel, and fails on a difference
// not listed in the deliberate table. It needs the binaries of
// hack/build-upstream.sh and skips under -short.
func TestDifferential(t *testing.T) {
	upBin := upstream.DeviceManager(t)
	dpBin := buildDpkitManager(t)
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runScenario(t, sc, upBin, dpBin)
		})
	}
}

// buildDpkitManager builds cmd/dpkit-devicemanager, with the race
// detector when this test binary has it.
func buildDpkitManager(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dpkit-devicemanager")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/dpkit-devicemanager")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", cmd.Args[1:], err, out)
	}
	return bin
}

// TestMain checks that no scenario leaves a goroutine behind: every
// plugin, watcher and process reader is stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
