package kubeconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeKubeconfig writes a kubeconfig whose server is host and returns
// its path.
func writeKubeconfig(t *testing.T, dir, name, host string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, host)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoadOrder checks the order: --kubeconfig, $KUBECONFIG,
// ~/.kube/config. The environment is the process's, so the cases run one
// after another.
func TestLoadOrder(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // no in-cluster configuration
	flag := writeKubeconfig(t, dir, "flag", "https://flag.example:6443")
	env := writeKubeconfig(t, dir, "env", "https://env.example:6443")
	writeKubeconfig(t, filepath.Join(home, ".kube"), "config", "https://home.example:6443")

	for _, tc := range []struct {
		name, flag, env, home, want string
	}{
		{"the flag first", flag, env, home, "https://flag.example:6443"},
		{"then $KUBECONFIG", "", env, home, "https://env.example:6443"},
		{"$KUBECONFIG is a list; missing files are skipped", "", filepath.Join(dir, "nope") + string(os.PathListSeparator) + env, home, "https://env.example:6443"},
		{"then ~/.kube/config", "", "", home, "https://home.example:6443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvVar, tc.env)
			t.Setenv("HOME", tc.home)
			cfg, err := Load(tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.want {
				t.Errorf("Host = %s, want %s", cfg.Host, tc.want)
			}
		})
	}
}

func TestLoadNotFound(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("HOME", dir)

	t.Setenv(EnvVar, "")
	_, err := Load("")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	for _, want := range []string{"--kubeconfig FILE", "$KUBECONFIG", "is not set", filepath.Join(dir, ".kube", "config") + " does not exist", "in-cluster"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}

	t.Setenv(EnvVar, filepath.Join(dir, "gone"))
	_, err = Load("")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "$KUBECONFIG="+filepath.Join(dir, "gone")+" names no file that exists") {
		t.Errorf("err = %v, want one naming $KUBECONFIG's value", err)
	}

	_, err = Load(filepath.Join(dir, "missing"))
	if err == nil || !strings.Contains(err.Error(), "--kubeconfig "+filepath.Join(dir, "missing")+": the file does not exist") {
		t.Errorf("err = %v, want one naming --kubeconfig", err)
	}

	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, bad)
	_, err = Load("")
	if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "$KUBECONFIG="+bad) {
		t.Errorf("err = %v, want the loader's error naming $KUBECONFIG", err)
	}
}
