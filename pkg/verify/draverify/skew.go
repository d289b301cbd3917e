package draverify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/verify"
)

// dra.registration.version-skew: a v1.37 control plane serves kubelets
// down to v1.34 (the version skew policy: three minor versions older).
// verify restarts the kubelet side as one of v1.34 to v1.36, which
// differ from v1.37 where they meet the driver only in health: they
// pick the DRAPlugin service as v1.37 does, from the same two, but watch
// health in v1alpha1 only, whether the driver lists it or not
// (kubernetes v1.34.4 to v1.36.3, pkg/kubelet/cm/dra/plugin/
// dra_plugin.go: servicesSupportedByKubelet, NodeWatchResources). Then
// it restarts it as v1.37 again.

// olderKubelet is what kubelets v1.34 to v1.36 speak to a DRA driver.
var olderKubelet = struct {
	versions string
	// services are the DRAPlugin services, newest first; the driver's
	// first one of them is called.
	services []string
	// health is the one health service watched, whatever the driver
	// lists.
	health string
}{"v1.34–v1.36", []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}, drahealthv1alpha1.DRAResourceHealthService}

// olderService picks the DRAPlugin service an older kubelet calls, as
// its validateSupportedServices does.
func olderService(versions []string) (string, error) {
	if len(versions) == 0 {
		return "", errors.New("empty list of supported gRPC services (aka supported versions)")
	}
	for _, s := range versions {
		if slices.Contains(olderKubelet.services, s) {
			return s, nil
		}
	}
	return "", fmt.Errorf("none of services supported by the plugin (%q) are supported by the kubelet (%q)", versions, olderKubelet.services)
}

// olderHandler is the DRA registration handler of an older kubelet: it
// validates and accepts, and verify calls the driver itself.
type olderHandler struct{}

func (olderHandler) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	if _, err := olderService(versions); err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return nil
}

func (h olderHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return h.ValidatePlugin(ctx, name, endpoint, versions)
}

func (olderHandler) DeRegisterPlugin(context.Context, string, string) {}

// startOlderKubelet starts the plugin watcher of an older kubelet on
// plugins_registry; stop stops it.
func (r *run) startOlderKubelet() (stop func(), err error) {
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:             r.registryDir,
		Handlers:        map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: recorder{next: olderHandler{}, ch: r.regs}},
		Logger:          kubeletLogger(r.log),
		ReconcilePeriod: 50 * time.Millisecond,
		InitialBackoff:  watcherBackoff,
		MaxBackoff:      watcherBackoff,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := w.Start(ctx); err != nil {
		cancel()
		return nil, err
	}
	return func() { cancel(); <-w.Done() }, nil
}

// healthAnswer is what a health stream answered first: reported devices,
// or why none.
type healthAnswer struct {
	devices int
	err     error
}

func (a healthAnswer) reports() bool { return a.devices > 0 }

func (a healthAnswer) String() string {
	switch {
	case a.reports():
		return fmt.Sprintf("reports %d device(s)", a.devices)
	case status.Code(a.err) == codes.Unimplemented:
		return "Unimplemented (" + status.Convert(a.err).Message() + ")"
	case a.err != nil:
		return a.err.Error()
	}
	return "no report"
}

// firstHealth opens c's health stream and waits up to d for a report of
// devices.
func firstHealth(ctx context.Context, c dramanager.Client, d time.Duration) healthAnswer {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stream, err := c.NodeWatchResources(ctx)
	for err == nil {
		m, rerr := stream.Recv()
		if rerr != nil {
			err = rerr
			break
		}
		if n := len(m.GetDevices()); n > 0 {
			return healthAnswer{devices: n}
		}
	}
	if ctx.Err() != nil {
		return healthAnswer{err: fmt.Errorf("no report within %s", d)}
	}
	return healthAnswer{err: err}
}

func (r *run) checkVersionSkew(ctx context.Context) bool {
	id := verify.CheckDRAVersionSkew
	if r.decided(id) {
		return true
	}
	if v := r.results[verify.CheckDRAKubeletRestart].Verdict; v != verify.Pass {
		r.set(id, verify.Skip, "see %s: the kubelet side is restarted twice here, and the driver did not register again at once after a restart (%s)", verify.CheckDRAKubeletRestart, v)
		return true
	}
	claim, err := r.newClaim(ctx, "claim-skew", r.devices[0], false)
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return true
	}
	defer r.forget(ctx, claim)
	// What a v1.37 kubelet gets: the health service it negotiated.
	newer := r.plugin
	r.stopKubelet()
	r.drainRegistrations()
	stop, err := r.startOlderKubelet()
	if err != nil {
		r.set(id, verify.Skip, "the kubelet side did not start as a kubelet %s: %v", olderKubelet.versions, err)
		return r.backToNewest(ctx, id)
	}
	detail, verdict := r.olderKubelet(ctx, claim, newer)
	stop()
	r.set(id, verdict, "%s", detail)
	return r.backToNewest(ctx, id)
}

// olderKubelet registers the driver with an older kubelet and calls it
// as that kubelet does.
func (r *run) olderKubelet(ctx context.Context, claim *resourcev1.ResourceClaim, newer dramanager.Client) (string, verify.Verdict) {
	reg, ok := r.waitRegistration(ctx, r.cfg.ReregisterThreshold)
	if !ok {
		if reg.err != nil {
			return fmt.Sprintf("a kubelet %s refused driver %s (versions %q): %v", olderKubelet.versions, reg.name, reg.versions, reg.err), verify.Fail
		}
		return fmt.Sprintf("not registered by a kubelet %s within %s", olderKubelet.versions, r.cfg.ReregisterThreshold), verify.Fail
	}
	svc, err := olderService(reg.versions)
	if err != nil {
		return err.Error(), verify.Fail
	}
	conn, err := grpc.NewClient("unix:"+reg.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err.Error(), verify.Fail
	}
	defer func() { _ = conn.Close() }()
	older := dramanager.NewClient(conn, svc, olderKubelet.health)
	res, err := r.prepareThrough(ctx, older, claim)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		return err.Error(), verify.Skip
	case err != nil:
		return fmt.Sprintf("a kubelet %s calls %s (versions %q): Prepare of claim-skew: %v", olderKubelet.versions, svc, reg.versions, err), verify.Fail
	}
	var uresp *drav1.NodeUnprepareResourcesResponse
	r.through(older, func() { uresp, err = r.unprepare(ctx, ref(claim)) })
	if err == nil {
		if p := unpreparedProblems(uresp, []*resourcev1.ResourceClaim{claim}); len(p) > 0 {
			err = errors.New(strings.Join(p, "; "))
		}
	}
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		return err.Error(), verify.Skip
	case err != nil:
		return fmt.Sprintf("a kubelet %s calls %s (versions %q): Unprepare of claim-skew: %v", olderKubelet.versions, svc, reg.versions, err), verify.Fail
	}
	prepared := fmt.Sprintf("registered by a kubelet %s (versions %q), prepared and unprepared in %s (%s)", olderKubelet.versions, reg.versions, svc, devicesOf(res))
	if newer.HealthService() == "" {
		return prepared + "; no health to a v1.37 kubelet (it lists no DRAResourceHealth service), none asked of the older", verify.Pass
	}
	// Both streams at once: the driver's answer in each.
	newerC := make(chan healthAnswer, 1)
	go func() { newerC <- firstHealth(ctx, newer, r.cfg.CallTimeout) }()
	old := firstHealth(ctx, older, r.cfg.CallTimeout)
	now := <-newerC
	switch {
	case now.reports() && !old.reports():
		return fmt.Sprintf("%s; but the driver reports health to a v1.37 kubelet (%s: %s) and not to a kubelet %s, which watches %s whatever the driver lists (versions %q): %s",
			prepared, newer.HealthService(), now, olderKubelet.versions, olderKubelet.health, reg.versions, old), verify.Fail
	case old.reports():
		return fmt.Sprintf("%s; health in %s %s", prepared, olderKubelet.health, old), verify.Pass
	}
	return fmt.Sprintf("%s; no health in %s (%s) nor in %s (%s)", prepared, newer.HealthService(), now, olderKubelet.health, old), verify.Pass
}

// backToNewest restarts the kubelet side as v1.37 for the rest of the
// run and waits for the driver to register again.
func (r *run) backToNewest(ctx context.Context, id string) bool {
	r.drainRegistrations()
	if err := r.startKubelet(); err != nil {
		return r.stop("the kubelet side did not start again: " + err.Error())
	}
	reg, ok := r.waitRegistration(ctx, r.cfg.ReregisterThreshold)
	if !ok {
		if ctx.Err() != nil {
			return false
		}
		r.set(id, verify.Fail, "not registered again within %s when the kubelet side went back to v1.37", r.cfg.ReregisterThreshold)
		return r.stop("see " + id)
	}
	return r.reconnect(reg)
}
