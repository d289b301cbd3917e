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
