package verify

import (
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// FuzzDeviceListProblems feeds arbitrary device lists, as a plugin could
// send them, to the first-message check: it must not panic, and it must
// report a duplicate or empty ID whenever there is one.
func FuzzDeviceListProblems(f *testing.F) {
	f.Add("dev-0,dev-1", "Healthy", int64(0))
	f.Add("a,a", "Unhealthy", int64(-1))
	f.Add(",", "", int64(3))
	f.Fuzz(func(t *testing.T, ids, health string, node int64) {
		var devs []*pluginapi.Device
		seen, bad := map[string]bool{}, false
		for _, id := range strings.Split(ids, ",") {
			if id == "" || seen[id] {
				bad = true
			}
			seen[id] = true
			devs = append(devs, &pluginapi.Device{ID: id, Health: health,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: node}}}})
		}
		problems := deviceListProblems(append(devs, nil))
		if len(problems) == 0 {
			t.Fatal("a null device was not reported")
		}
		if bad && len(deviceListProblems(devs)) == 0 {
			t.Fatalf("ids %q: duplicate or empty ID not reported", ids)
		}
	})
}

func TestExpandArgs(t *testing.T) {
	got := expandArgs([]string{"--dir={plugin-dir}", "{registry-dir}/x", "plain"}, "/p", "/r")
	want := []string{"--dir=/p", "/r/x", "plain"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("expandArgs = %q, want %q", got, want)
	}
	if got := expandArgs([]string{"{registry-dir}"}, "/p", ""); got[0] != "{registry-dir}" {
		t.Errorf("without a registry dir the placeholder must stay, got %q", got[0])
	}
}
