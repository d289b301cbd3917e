package dptest_test

import (
	"context"
	"errors"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

func TestDevices(t *testing.T) {
	k := dptest.NewKubelet(t)
	d := dptest.NewDevices("dev-0", "dev-1")
	boom := errors.New("boom")
	dptest.Serve(t, k,
		deviceplugin.Resource{Name: "example.com/foo", Plugin: d},
		deviceplugin.Resource{Name: "example.com/bar", Plugin: dptest.NewDevices("b").PreStarting(func(context.Context, []string) error { return boom })})
	k.WaitForDevices(t, "example.com/foo", dptest.Healthy(2))

	if !d.SetHealth("dev-1", false) {
		t.Fatal("SetHealth: dev-1 unknown")
	}
	k.WaitForDevices(t, "example.com/foo", dptest.Health("dev-1", pluginapi.Unhealthy))
	if d.SetHealth("nope", false) {
		t.Error("SetHealth of an unknown device reported success")
	}
	d.SetHealth("dev-1", true)
	k.WaitForDevices(t, "example.com/foo", dptest.Healthy(2))

	resp, err := k.Allocate(context.Background(), "example.com/foo", "dev-0", "dev-1")
	if err != nil || resp.Envs[dptest.EnvDevices] != "dev-0,dev-1" {
		t.Fatalf("Allocate: %v %v, want %s=dev-0,dev-1", resp, err, dptest.EnvDevices)
	}

	k.WaitForDevices(t, "example.com/bar", dptest.Healthy(1))
	if p := k.Plugin("example.com/foo"); p.Options.PreStartRequired {
		t.Error("Devices asks for PreStartContainer")
	}
	if p := k.Plugin("example.com/bar"); !p.Options.PreStartRequired {
		t.Error("PreStarting does not ask for PreStartContainer")
	}
	_, err = k.Client(t, "example.com/bar").PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"b"}})
	if err == nil {
		t.Error("PreStartContainer: no error, want the hook's")
	}
}
