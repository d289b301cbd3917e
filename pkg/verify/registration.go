package verify

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// The checks of the plugin's registration (registration.options; the
// other registration.* are judged in run.go from every registration) and
// of the plugin watcher's path (plugin-watcher).

func resourceNameProblems(name string) []string { return resourcename.Problems(name) }

// checkOptions compares the registered options with GetDevicePluginOptions
// and with the RPCs the plugin implements.
func (r *runner) checkOptions(ctx context.Context) {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		c := r.emu.current(res)
		if c == nil {
			o.skip(res, "not registered any more")
			continue
		}
		opts := c.Options
		var problems, notes []string
		for _, reg := range regs {
			if reg.Resource == res && reg.Err == nil && reg.Options != nil &&
				(reg.Options.PreStartRequired != opts.PreStartRequired || reg.Options.GetPreferredAllocationAvailable != opts.GetPreferredAllocationAvailable) {
				notes = append(notes, fmt.Sprintf("Register claimed preStartRequired=%t getPreferredAllocationAvailable=%t but GetDevicePluginOptions answers %t/%t (the kubelet uses the latter)",
					reg.Options.PreStartRequired, reg.Options.GetPreferredAllocationAvailable, opts.PreStartRequired, opts.GetPreferredAllocationAvailable))
				break
			}
		}
		st, _ := r.state(res)
		if opts.GetPreferredAllocationAvailable {
			if err := r.preferredProbe(ctx, c, st); status.Code(err) == codes.Unimplemented {
				problems = append(problems, "claims GetPreferredAllocationAvailable but GetPreferredAllocation answers Unimplemented")
			}
		}
		if opts.PreStartRequired {
			ids := st.healthy
			if len(ids) > 1 {
				ids = ids[:1]
			}
			cctx, cancel := r.callCtx(ctx)
			_, err := c.Client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids})
			cancel()
			if status.Code(err) == codes.Unimplemented {
				problems = append(problems, "claims PreStartRequired but PreStartContainer answers Unimplemented")
			}
		}
		switch {
		case len(problems) > 0:
			o.fail(res, "%s", strings.Join(problems, "; "))
		case len(notes) > 0:
			o.warn(res, "%s", strings.Join(notes, "; "))
		default:
			o.pass(res, "preStartRequired=%t getPreferredAllocationAvailable=%t", opts.PreStartRequired, opts.GetPreferredAllocationAvailable)
		}
	}
	r.conclude(CheckOptions, o)
}

// preferredProbe calls GetPreferredAllocation with a simple valid request.
func (r *runner) preferredProbe(ctx context.Context, c *conn, st deviceState) error {
	avail := st.healthy
	if len(avail) == 0 {
		avail = []string{"none"}
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	_, err := c.Client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail, AllocationSize: 1}},
	})
	return err
}

// checkPluginWatcher checks the plugins_registry path: in plugin-watcher
// mode the registration through it, otherwise whether the plugin's socket
// also answers GetInfo.
func (r *runner) checkPluginWatcher(ctx context.Context) {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		if r.registry() {
			var refused []string
			accepted := 0
			for _, reg := range regs {
				if reg.Resource != res || reg.Via != viaRegistry {
					continue
				}
				if reg.Err != nil {
					refused = append(refused, reg.Err.Error())
				} else {
					accepted++
				}
			}
			switch {
			case len(refused) > 0:
				o.fail(res, "refused: %s", strings.Join(dedupe(refused), "; "))
			case accepted == 0:
				o.fail(res, "registered through kubelet.sock, not through %s", r.registryDir)
			default:
				o.pass(res, "registered through plugins_registry")
			}
			continue
		}
		c := r.emu.current(res)
		if c == nil {
			o.skip(res, "not registered any more")
			continue
		}
		cc, err := dialPlugin(c.Socket)
		if err != nil {
			o.skip(res, "cannot dial: %v", err)
			continue
		}
		cctx, cancel := r.callCtx(ctx)
		info, err := registerapi.NewRegistrationClient(cc).GetInfo(cctx, &registerapi.InfoRequest{})
		cancel()
		_ = cc.Close()
		switch {
		case status.Code(err) == codes.Unimplemented:
			o.skip(res, "the plugin registers through kubelet.sock only; run with --plugin-watcher to check a plugins_registry mode")
		case err != nil:
			o.fail(res, "GetInfo on the plugin socket failed: %s", statusMessage(err))
		case info.Type != registerapi.DevicePlugin:
			o.fail(res, "GetInfo answers type %q; the kubelet hands only %q to the device manager", info.Type, registerapi.DevicePlugin)
		case info.Name != res:
			o.fail(res, "GetInfo answers name %q, but the plugin registered %q", info.Name, res)
		default:
			if err := (registryHandler{e: r.emu}).validateOnly(info.Name, info.SupportedVersions); err != nil {
				o.fail(res, "the kubelet's plugin watcher would refuse it: %v", err)
			} else {
				o.pass(res, "the socket also answers GetInfo (%s, versions %v)", info.Name, info.SupportedVersions)
			}
		}
	}
	r.conclude(CheckPluginWatcher, o)
}
