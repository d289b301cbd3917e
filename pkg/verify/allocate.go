package verify

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The checks of Allocate (allocate.*; allocate.every-device is in
// everydevice.go) and of PreStartContainer (prestart).

// unknownID returns a device ID that st does not have.
func unknownID(st deviceState) string {
	id := "dpkit-verify-unknown-device"
	for slices.Contains(st.healthy, id) || slices.Contains(st.unhealthy, id) {
		id += "-x"
	}
	return id
}

func (r *runner) allocate(ctx context.Context, c *conn, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	return c.Client.Allocate(cctx, req)
}

// checkAllocate decides the allocate.* checks. allocate.every-device comes
// first: the other checks then allocate only devices that succeeded alone,
// so that a device whose Allocate fails is one failure, of that check.
func (r *runner) checkAllocate(ctx context.Context) {
	resp, unknown, unhealthy, conc, every := r.outcome(), r.outcome(), r.outcome(), r.outcome(), r.outcome()
	defer r.conclude(CheckEveryDevice, every)
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		if c == nil || !ok {
			for _, o := range []*outcome{resp, unknown, unhealthy, conc, every} {
				o.skip(res, "no device list; see %s", CheckFirstMessage)
			}
			continue
		}
		failedAlone := r.everyDevice(ctx, every, res, c, st.healthy)
		// The devices as the kubelet sees them now, but those that failed
		// alone.
		st, _ = r.state(res)
		st.healthy = slices.DeleteFunc(st.healthy, func(id string) bool { return failedAlone[id] })
		// One response per container request.
		switch n := len(st.healthy); {
		case n == 0 && len(failedAlone) > 0:
			resp.skip(res, "every healthy device failed Allocate alone; see %s", CheckEveryDevice)
		case n == 0:
			resp.skip(res, "no healthy device to allocate%s", r.viewNote(res))
		default:
			containers := [][]string{{st.healthy[0]}}
			if n > 1 {
				containers = append(containers, []string{st.healthy[1]})
			}
			out, err := r.allocate(ctx, c, containers...)
			switch {
			case err != nil:
				resp.fail(res, "Allocate of healthy device(s) %v failed: %s", containers, statusMessage(err))
			case len(out.ContainerResponses) != len(containers):
				resp.fail(res, "%d container requests got %d responses; the kubelet fails the pod", len(containers), len(out.ContainerResponses))
			default:
				resp.pass(res, "%d container requests, %d responses", len(containers), len(out.ContainerResponses))
			}
		}
		// Unknown device.
		id := unknownID(st)
		if _, err := r.allocate(ctx, c, []string{id}); err == nil {
			unknown.fail(res, "Allocate of unknown device %q succeeded", id)
		} else {
			unknown.pass(res, "refused: %s", statusMessage(err))
		}
		// Unhealthy device.
		if len(st.unhealthy) == 0 {
			unhealthy.skip(res, "no device is unhealthy")
		} else if _, err := r.allocate(ctx, c, []string{st.unhealthy[0]}); err == nil {
			unhealthy.fail(res, "Allocate of unhealthy device %q succeeded", st.unhealthy[0])
		} else {
			unhealthy.pass(res, "%q refused: %s", st.unhealthy[0], statusMessage(err))
		}
		// Concurrent calls.
		switch {
		case len(st.healthy) == 0 && len(failedAlone) > 0:
			conc.skip(res, "every healthy device failed Allocate alone; see %s", CheckEveryDevice)
			continue
		case len(st.healthy) == 0:
			conc.skip(res, "no healthy device to allocate%s", r.viewNote(res))
			continue
		}
		const calls = 8
		errs := make([]error, calls)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The first two healthy devices: a device that changes
				// health meanwhile must not make the check flaky.
				out, err := r.allocate(ctx, c, []string{st.healthy[i%min(2, len(st.healthy))]})
				if err == nil && len(out.ContainerResponses) != 1 {
					err = fmt.Errorf("%d responses for 1 container", len(out.ContainerResponses))
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		var failed []string
		for _, err := range errs {
			if err != nil {
				failed = append(failed, statusMessage(err))
			}
		}
		if len(failed) > 0 {
			conc.fail(res, "%d of %d concurrent calls failed: %s", len(failed), calls, strings.Join(dedupe(failed), "; "))
		} else {
			conc.pass(res, "%d concurrent calls succeeded", calls)
		}
	}
	r.conclude(CheckResponses, resp)
	r.conclude(CheckUnknown, unknown)
	r.conclude(CheckUnhealthy, unhealthy)
	r.conclude(CheckConcurrent, conc)
}

func (r *runner) checkPreStart(ctx context.Context) {
	o := r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		switch {
		case c == nil || !ok:
			o.skip(res, "no device list; see %s", CheckFirstMessage)
			continue
		case !c.Options.PreStartRequired:
			o.skip(res, "not required (PreStartRequired is false)")
			continue
		case len(st.healthy) == 0:
			o.skip(res, "no healthy device%s", r.viewNote(res))
			continue
		}
		cctx, cancel := r.callCtx(ctx)
		_, err := c.Client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: st.healthy[:1]})
		cancel()
		switch {
		case status.Code(err) == codes.Unimplemented:
			o.skip(res, "answers Unimplemented; see %s", CheckOptions)
		case err != nil:
			o.fail(res, "PreStartContainer(%v) failed: %s", st.healthy[:1], statusMessage(err))
		default:
			o.pass(res, "PreStartContainer(%v) succeeded", st.healthy[:1])
		}
	}
	r.conclude(CheckPreStart, o)
}
