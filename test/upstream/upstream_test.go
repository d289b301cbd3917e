package upstream_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/test/upstream"
)

func TestFind(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe := filepath.Join(dir, upstream.SamplePluginName)
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, upstream.DeviceManagerName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, bin string
		want      string // path, or "" for ErrBinariesMissing
	}{
		{"present and executable", upstream.SamplePluginName, exe},
		{"not executable", upstream.DeviceManagerName, ""},
		{"absent", "nope", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := upstream.Find(dir, tc.bin)
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("Find = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, upstream.ErrBinariesMissing) {
				t.Fatalf("Find = %q, %v; want ErrBinariesMissing", got, err)
			}
			for _, s := range []string{tc.bin, dir, upstream.EnvBinDir + "=" + dir, upstream.BuildScript} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestBinDirFollowsEnv(t *testing.T) {
	t.Setenv(upstream.EnvBinDir, "/x/y")
	if got := upstream.BinDir(); got != "/x/y" {
		t.Fatalf("BinDir = %q with %s=/x/y", got, upstream.EnvBinDir)
	}
	t.Setenv(upstream.EnvBinDir, "")
	if got := upstream.BinDir(); got != upstream.DefaultBinDir() || !strings.HasSuffix(got, filepath.Join("dpkit", "upstream", upstream.Version)) {
		t.Fatalf("BinDir = %q, want DefaultBinDir ending in dpkit/upstream/%s", got, upstream.Version)
	}
	if cmd := upstream.BuildCommand(upstream.DefaultBinDir()); strings.Contains(cmd, upstream.EnvBinDir) {
		t.Errorf("BuildCommand for the default directory sets %s: %q", upstream.EnvBinDir, cmd)
	}
	if cmd := upstream.BuildCommand("/a b"); !strings.HasPrefix(cmd, upstream.EnvBinDir+"='/a b' bash ") {
		t.Errorf("BuildCommand(\"/a b\") = %q, want the directory quoted", cmd)
	}
}

func TestSamplePluginEnv(t *testing.T) {
	env := upstream.SamplePluginEnv("/r/plugins_registry", "/c/hold")
	tail := env[len(env)-2:]
	want := []string{upstream.EnvSampleSockDir + "=/r/plugins_registry", upstream.EnvSampleRegisterControlFile + "=/c/hold"}
	if tail[0] != want[0] || tail[1] != want[1] {
		t.Fatalf("SamplePluginEnv ends with %q, want %q", tail, want)
	}
}
