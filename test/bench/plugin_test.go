// Package bench holds benchmarks that run dpkit as a real process.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

// LeanTags are the build tags of the plugin image's binary (Dockerfile,
// make build-lean): only "dpkit plugin" and "dpkit version", no gRPC tracing.
const LeanTags = "dpkit_lean grpcnotrace"

// BenchmarkPluginIdleRSS builds dpkit, runs "dpkit plugin" with 4
// resources of 64 fake devices each against a fake kubelet, waits until all
// four are registered and their devices listed, and reports the process's
// resident memory (goal: under 15 MiB) and its anonymous part. Binary pages
// count towards RSS, so it is measured for the lean static binary the
// plugin image ships and for the full dpkit binary.
func BenchmarkPluginIdleRSS(b *testing.B) {
	b.Run("lean", func(b *testing.B) { benchIdleRSS(b, LeanTags) })
	b.Run("full", func(b *testing.B) { benchIdleRSS(b, "") })
}

func benchIdleRSS(b *testing.B, tags string) {
	bin := filepath.Join(b.TempDir(), "dpkit")
	build := exec.Command("go", "build", "-tags", tags, "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/dpkit/dpkit/cmd/dpkit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	var cfg strings.Builder
	cfg.WriteString("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n")
	for i := range 4 {
		fmt.Fprintf(&cfg, "    - {name: example.com/res%d, count: 64, numaNodes: 2}\n", i)
	}
	cfgPath := filepath.Join(b.TempDir(), "plugin.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	k := dptest.NewKubelet(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "plugin", "--config", cfgPath, "--plugin-dir", k.PluginDir(), "--registration", "kubelet")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	for i := range 4 {
		k.WaitForDevices(b, fmt.Sprintf("example.com/res%d", i), dptest.Healthy(64))
	}
	var rss, anon float64
	for b.Loop() {
		rss = statusKB(b, cmd.Process.Pid, "VmRSS:")
		anon = statusKB(b, cmd.Process.Pid, "RssAnon:")
	}
	b.ReportMetric(rss/(1<<20), "MiB-RSS")
	b.ReportMetric(anon/(1<<20), "MiB-anon")
}

// statusKB reads a field of /proc/PID/status, in bytes.
func statusKB(b *testing.B, pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
