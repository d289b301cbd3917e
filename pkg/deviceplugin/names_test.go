package deviceplugin

import (
	"strings"
	"testing"
)

func TestValidateResourceName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, msg string
	}{
		{"example.com/foo", ""},
		{"nvidia.com/gpu", ""},
		{"amd.com/gpu", ""},
		{"foo", "must be domain-qualified"},
		{"", "is empty"},
		{"kubernetes.io/foo", "reserved for Kubernetes"},
		{"sub.kubernetes.io/foo", "reserved for Kubernetes"},
		{"requests.example.com/foo", `must not start with "requests."`},
		{"example.com/foo bar", "alphanumeric"},
		{"example.com/" + strings.Repeat("a", 64), "no more than 63"},
		{"-example.com/foo", "prefix part"},
	} {
		err := ValidateResourceName(tc.name)
		switch {
		case tc.msg == "" && err != nil:
			t.Errorf("%q: unexpected error %v", tc.name, err)
		case tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%q: error %v, want one containing %q", tc.name, err, tc.msg)
		case err != nil && !strings.Contains(err.Error(), `"example.com/foo"`):
			t.Errorf("%q: error %q shows no valid example", tc.name, err)
		}
	}
}

func TestRegistryDirDefaultsBesidePluginDir(t *testing.T) {
	t.Parallel()
	for plugin, want := range map[string]string{
		"":                                 "/var/lib/kubelet/plugins_registry",
		"/var/lib/kubelet/device-plugins/": "/var/lib/kubelet/plugins_registry",
		"/tmp/k/device-plugins":            "/tmp/k/plugins_registry",
	} {
		if got := (Config{PluginDir: plugin}).withDefaults().RegistryDir; got != want {
			t.Errorf("PluginDir %q: RegistryDir = %q, want %q", plugin, got, want)
		}
	}
}

// $DPKIT_PLUGIN_DIR and $DPKIT_REGISTRY_DIR are the defaults of the
// directories the author left empty, and only of those. Not parallel: it
// sets the environment.
func TestDirectoriesFromEnvironment(t *testing.T) {
	t.Setenv(EnvPluginDir, "/run/verify/device-plugins")
	t.Setenv(EnvRegistryDir, "/run/verify/plugins_registry")
	for _, tc := range []struct {
		name             string
		cfg              Config
		plugin, registry string
	}{
		{"zero", Config{}, "/run/verify/device-plugins", "/run/verify/plugins_registry"},
		{"plugin dir set", Config{PluginDir: "/k/device-plugins"}, "/k/device-plugins", "/run/verify/plugins_registry"},
		{"both set", Config{PluginDir: "/k/device-plugins", RegistryDir: "/k/reg"}, "/k/device-plugins", "/k/reg"},
	} {
		got := tc.cfg.withDefaults()
		if got.PluginDir != tc.plugin || got.RegistryDir != tc.registry {
			t.Errorf("%s: PluginDir %q, RegistryDir %q; want %q, %q", tc.name, got.PluginDir, got.RegistryDir, tc.plugin, tc.registry)
		}
	}
	t.Setenv(EnvPluginDir, "relative/dir")
	err := Config{}.withDefaults().validate([]Resource{{Name: "example.com/foo", Plugin: nil}})
	if err == nil || !strings.Contains(err.Error(), `PluginDir: "relative/dir" (from $DPKIT_PLUGIN_DIR) must be an absolute path`) {
		t.Errorf("relative $%s: error %v, want one naming the variable", EnvPluginDir, err)
	}
}
