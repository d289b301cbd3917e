package draverify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/verify"
)

// dra.registration.rolling-update: a DaemonSet updated with maxSurge
// runs the new pod beside the old one. verify starts a second instance
// of the driver with the same command in another pod ($POD_UID,
// {pod-uid}), prepares a claim through both while both serve, stops the
// first with SIGTERM and prepares and unprepares the claim through the
// second, the one the kubelet is left with. The second instance then is
// the driver for the rest of the run.

// instance is one running instance of the driver.
type instance struct {
	pod      types.UID
	proc     *verifyproc.Process
	command  []string
	env      []string
	endpoint string
	// regSocket is the registration socket the plugin watcher
	// registered it through.
	regSocket string
	plugin    dramanager.Client
	// before are the sockets there were before the instance started.
	before []string
}

// registrationSocket is the registration socket the plugin watcher
// registered endpoint through, "" when none within --call-timeout (the
// watcher records a registration once its handler took it).
func (r *run) registrationSocket(ctx context.Context, endpoint string) string {
	deadline := time.Now().Add(r.cfg.CallTimeout)
	for {
		for _, p := range r.pw.Plugins() {
			if p.Name == r.driver && p.Endpoint == endpoint {
				return p.SocketPath
			}
		}
		if time.Now().After(deadline) || !sleep(ctx, 10*time.Millisecond) {
			return ""
		}
	}
}

// endpoints lists the endpoints of the driver the kubelet side has
// registered, oldest first.
func (r *run) endpoints() []string {
	var out []string
	for _, p := range r.mgr.Plugins() {
		if p.Driver == r.driver {
			out = append(out, p.Endpoint)
		}
	}
	return out
}

// waitEndpoints waits up to d until the kubelet side has registered
// exactly want for the driver.
func (r *run) waitEndpoints(ctx context.Context, d time.Duration, want ...string) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		changed := r.mgr.PluginsChanged()
		got := r.endpoints()
		if slices.Equal(got, want) {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// waitSecond waits up to d for a registration of the second instance:
// accepted, on any endpoint; ok is false when proc exited or none came.
func (r *run) waitSecond(ctx context.Context, proc *verifyproc.Process, d time.Duration) (reg registration, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case reg = <-r.regs:
			if reg.err == nil && reg.name == r.driver {
				return reg, true
			}
		case <-proc.Done():
			return reg, false
		case <-t.C:
			return reg, false
		case <-ctx.Done():
			return reg, false
		}
	}
}

// client dials endpoint and calls it in the services its registration
// negotiates.
func client(reg registration) (dramanager.Client, *grpc.ClientConn, error) {
	svc, health, err := dramanager.Negotiate(reg.versions)
	if err != nil {
		return dramanager.Client{}, nil, err
	}
	conn, err := grpc.NewClient("unix:"+reg.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return dramanager.Client{}, nil, err
	}
	return dramanager.NewClient(conn, svc, health), conn, nil
}

// through runs fn with r.plugin set to c: the calls of fn go to that
// instance.
func (r *run) through(c dramanager.Client, fn func()) {
	saved := r.plugin
	r.plugin = c
	defer func() { r.plugin = saved }()
	fn()
}

// prepareThrough prepares claim through c and returns its devices (pool
// and name), or why it was not prepared.
func (r *run) prepareThrough(ctx context.Context, c dramanager.Client, claim *resourcev1.ResourceClaim) (*drav1.NodePrepareResourceResponse, error) {
	var resp *drav1.NodePrepareResourcesResponse
	var err error
	r.through(c, func() { resp, err = r.prepare(ctx, claim) })
	if err != nil {
		return nil, err
	}
	if problems := preparedProblems(resp, []*resourcev1.ResourceClaim{claim}); len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return resp.Claims[string(claim.UID)], nil
}

func (r *run) checkRollingUpdate(ctx context.Context) bool {
	id := verify.CheckDRARollingUpdate
	if r.decided(id) {
		return true
	}
	claim, err := r.newClaim(ctx, "claim-rolling", r.devices[0], false)
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return true
	}
	// Last: through the instance the run goes on with.
	defer r.forget(ctx, claim)
	first := &instance{pod: r.driverPod, proc: r.proc, command: r.command, env: r.env, endpoint: r.endpoint, regSocket: r.registrationSocket(ctx, r.endpoint), plugin: r.plugin}
	second := &instance{pod: uuid.NewUUID()}
	second.command, second.env = r.driverCommand(second.pod)
	var secondConn *grpc.ClientConn
	defer func() {
		// The run goes on with the instance r.proc names; the other is
		// gone or killed here.
		for _, in := range []*instance{first, second} {
			if in.proc != nil && in.proc != r.proc {
				in.proc.Kill()
			}
		}
		if secondConn != nil {
			_ = secondConn.Close()
		}
	}()
	reg, took, next := r.startSecond(ctx, first, second)
	if next != nil {
		return next()
	}
	second.plugin, secondConn, err = client(reg)
	if err != nil {
		r.set(id, verify.Fail, "the second instance's registration: %v", err)
		return r.single(ctx, first, second)
	}
	// The overlap: both registered, both answer for the claim. A second
	// instance that took the first's registration socket leaves the
	// kubelet with it alone, which serves; whether the first's exit
	// leaves it registered decides.
	var note string
	if !slices.Contains(r.endpoints(), first.endpoint) {
		note = fmt.Sprintf(" (the first was unregistered when the second registered through %s, a registration socket of %s)", filepath.Base(second.regSocket), sameOrOwn(first.regSocket, second.regSocket))
	}
	var problems []string
	res, err := r.prepareThrough(ctx, first.plugin, claim)
	if err != nil {
		problems = append(problems, fmt.Sprintf("Prepare of claim-rolling through the first instance during the overlap: %v", err))
	}
	last, err2 := r.prepareThrough(ctx, second.plugin, claim)
	if err2 != nil {
		problems = append(problems, fmt.Sprintf("Prepare of claim-rolling through the second instance during the overlap: %v", err2))
	}
	if first.proc.Exit() != "" {
		problems = append(problems, "the first instance "+first.proc.Exit()+" when the second started")
	}
	switch {
	case errors.Is(err, errTimedOut) || errors.Is(err2, errTimedOut):
		// One cause, one failure: dra.prepare.timeout judges it.
		r.set(id, verify.Skip, "%s", strings.Join(problems, "; "))
		return r.single(ctx, first, second)
	case len(problems) > 0:
		r.set(id, verify.Fail, "%s", strings.Join(problems, "; "))
		return r.single(ctx, first, second)
	}
	if r.stopFirst(ctx, claim, first, second, res, last, took, note) {
		return r.single(ctx, first, second)
	}
	return r.adopt(second, reg)
}

// startSecond starts the second instance and waits for its
// registration; next, when not nil, is how the check ends: it decided
// the verdict.
func (r *run) startSecond(ctx context.Context, first, second *instance) (reg registration, took time.Duration, next func() bool) {
	id := verify.CheckDRARollingUpdate
	second.before = r.sockets()
	r.drainRegistrations()
	start := time.Now()
	var err error
	second.proc, err = verifyproc.Start(second.command, second.env)
	if err != nil {
		r.set(id, verify.Skip, "could not start a second instance of the driver: %v", err)
		return reg, 0, func() bool { return true }
	}
	single := func() bool { return r.single(ctx, first, second) }
	reg, ok := r.waitSecond(ctx, second.proc, r.cfg.RegisterTimeout)
	switch {
	case ctx.Err() != nil:
		return reg, 0, func() bool { return false }
	case !ok && second.proc.Exit() != "":
		r.set(id, verify.Skip, "the driver does not run a second instance beside the first: started with %s=%s, it %s without registering (deploy it with maxSurge 0, the DaemonSet default, where the old pod stops before the new one starts)", verifyproc.EnvPodUID, second.pod, second.proc.Exit())
		return reg, 0, single
	case !ok:
		r.set(id, verify.Fail, "a second instance, started with %s=%s while the first served, did not register within %s", verifyproc.EnvPodUID, second.pod, r.cfg.RegisterTimeout)
		return reg, 0, single
	case reg.endpoint == first.endpoint:
		r.set(id, verify.Skip, "the driver does not support rolling updates: a second instance, started with %s=%s, registered the first's endpoint %s (deploy it with maxSurge 0, the DaemonSet default: with two at once, the first's exit removes the second's sockets)", verifyproc.EnvPodUID, second.pod, filepath.Base(reg.endpoint))
		return reg, 0, single
	}
	second.endpoint, second.regSocket = reg.endpoint, r.registrationSocket(ctx, reg.endpoint)
	return reg, reg.at.Sub(start), nil
}

// stopFirst stops the first instance, as the old pod of the update, and
// judges what the second does then; res and last are the first's and
// the second's answers for claim during the overlap.
func (r *run) stopFirst(ctx context.Context, claim *resourcev1.ResourceClaim, first, second *instance, res, last *drav1.NodePrepareResourceResponse, took time.Duration, note string) (backToFirst bool) {
	id := verify.CheckDRARollingUpdate
	// The specs of the claim's last answer: the first's exit must leave
	// them.
	added := r.cdiAdded(map[string]string{}, last)
	r.proc = first.proc
	_, _ = r.signalWait(syscall.SIGTERM, 2*r.cfg.TermTimeout)
	r.proc = second.proc
	var gone []string
	for _, p := range []string{second.regSocket, second.endpoint} {
		if _, err := os.Lstat(p); p != "" && err != nil {
			gone = append(gone, filepath.Base(p))
		}
	}
	if len(gone) > 0 {
		r.set(id, verify.Fail, "the first instance's exit removed the second's socket(s) %s (%s, a registration socket %s): the kubelet unregisters the second instance, and the driver's claims cannot be prepared until it restarts", strings.Join(gone, ", "), filepath.Base(second.regSocket), sameOrOwn(first.regSocket, second.regSocket))
		return true
	}
	// The first's exit must leave the claim's CDI spec: the claim is
	// prepared, and its container runs.
	if left := slices.DeleteFunc(slices.Clone(added), func(id string) bool { return len(r.cdiLeft([]string{id})) > 0 }); len(left) > 0 {
		r.set(id, verify.Fail, "once the first instance stopped, the CDI spec of claim-rolling, prepared through both, no longer defines %s: a running container's devices are gone", strings.Join(left, ", "))
		return false
	}
	// What the first left is dra.shutdown.exit's to judge, on the
	// instance that stops last.
	for _, p := range []string{first.regSocket, first.endpoint} {
		if p != "" && p != second.regSocket && p != second.endpoint {
			_ = os.Remove(p)
		}
	}
	if !r.waitEndpoints(ctx, r.cfg.CallTimeout, second.endpoint) {
		r.set(id, verify.Fail, "once the first instance stopped, the kubelet side has the endpoints %q of the driver, want only the second's %s", r.endpoints(), second.endpoint)
		return true
	}
	after, err := r.prepareThrough(ctx, second.plugin, claim)
	if err == nil && devicesOf(after) != devicesOf(res) {
		err = fmt.Errorf("it names %s, the first instance %s", devicesOf(after), devicesOf(res))
	}
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
		return false
	case err != nil:
		r.set(id, verify.Fail, "once the first instance stopped, Prepare of claim-rolling (prepared by the first) through the second: %v", err)
		return false
	}
	var uresp *drav1.NodeUnprepareResourcesResponse
	r.through(second.plugin, func() { uresp, err = r.unprepare(ctx, ref(claim)) })
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
	case err != nil:
		r.set(id, verify.Fail, "once the first instance stopped, Unprepare of claim-rolling through the second: %v", err)
	case len(unpreparedProblems(uresp, []*resourcev1.ResourceClaim{claim})) > 0:
		r.set(id, verify.Fail, "once the first instance stopped, Unprepare of claim-rolling through the second: %s", strings.Join(unpreparedProblems(uresp, []*resourcev1.ResourceClaim{claim}), "; "))
	default:
		r.set(id, verify.Pass, "a second instance (%s=%s) registered %s after start at %s beside the first's %s%s; both prepared claim-rolling (%s); once the first %s, the second alone was registered and prepared and unprepared it",
			verifyproc.EnvPodUID, second.pod, took.Round(time.Millisecond), filepath.Base(second.endpoint), filepath.Base(first.endpoint), note, devicesOf(res), first.proc.Exit())
	}
	return false
}

// sameOrOwn says whether the second instance registered through the
// first's registration socket.
func sameOrOwn(first, second string) string {
	if first != "" && first == second {
		return "with the same name as the first's"
	}
	return "of its own"
}

// devicesOf sums up a result's devices by pool and name.
func devicesOf(res *drav1.NodePrepareResourceResponse) string {
	var out []string
	for _, d := range res.GetDevices() {
		out = append(out, d.PoolName+"/"+d.DeviceName)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// adopt makes the second instance the driver of the rest of the run.
func (r *run) adopt(second *instance, reg registration) bool {
	r.proc, r.driverPod, r.command, r.env, r.endpoint = second.proc, second.pod, second.command, second.env, second.endpoint
	if err := r.connect(reg); err != nil {
		return r.stop(err.Error())
	}
	return true
}

// single ends an update that did not go through: both instances are
// killed and the first's pod starts one again, as the DaemonSet
// controller would bring one pod back.
func (r *run) single(ctx context.Context, first, second *instance) bool {
	second.proc.Kill()
	// What the killed instance left is verify's doing: gone, so that
	// dra.shutdown.exit judges the instance that stops last.
	for _, p := range r.sockets() {
		if !slices.Contains(second.before, p) {
			_ = os.Remove(p)
		}
	}
	r.proc, r.command, r.env, r.driverPod = first.proc, first.command, first.env, first.pod
	return r.restartDriver(ctx, verify.CheckDRARollingUpdate)
}
