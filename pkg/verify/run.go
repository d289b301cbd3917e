package verify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/kubeletreg"
	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

// runner holds one run's state.
type runner struct {
	cfg     Config
	log     *slog.Logger
	checks  map[string]CheckInfo
	results map[string]*Result
	// reported are the checks whose final result went to Config.Progress.
	reported map[string]bool

	root        string // temporary directory we created; "" with SocketDir
	pluginDir   string
	seenDir     string // pluginDir as the plugin sees it (--private-mount)
	registryDir string
	command     []string
	emu         *emulator
	pw          *pluginwatcher.Watcher
	pwCancel    context.CancelFunc
	proc        *verifyproc.Process
	start       time.Time

	resources []string
	watchers  map[string]*conn // the verifier's own ListAndWatch stream per resource
	stopWatch context.CancelFunc
	initial   map[string]int // registrations per resource at start

	// stopped is why the run stopped before every check was done (the
	// plugin exited), the detail of the checks it did not reach.
	stopped string
	// diedDuring names the step during which the plugin exited.
	diedDuring string
}

func (r *runner) registry() bool { return r.cfg.PluginWatcher }

func (r *runner) setup() error {
	cfg := r.cfg
	if cfg.SocketDir != "" {
		r.pluginDir = cfg.SocketDir
		sock := filepath.Join(cfg.SocketDir, filepath.Base(pluginapi.KubeletSocket))
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			_ = c.Close()
			return fmt.Errorf("--socket-dir: a kubelet already serves %s; stop it, or point the plugin at another directory", sock)
		}
	} else {
		root, err := os.MkdirTemp("", "dpv")
		if err != nil {
			return fmt.Errorf("create the emulated kubelet's directory: %w", err)
		}
		r.root = root
		r.pluginDir = filepath.Join(root, "device-plugins")
		if err := os.Mkdir(r.pluginDir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", r.pluginDir, err)
		}
		if cfg.PluginWatcher {
			r.registryDir = filepath.Join(root, "plugins_registry")
			if err := os.Mkdir(r.registryDir, 0o750); err != nil {
				return fmt.Errorf("create %s: %w", r.registryDir, err)
			}
			// Like a kubelet with the plugin watcher: plugins that find
			// this file skip kubelet.sock.
			if err := os.WriteFile(filepath.Join(r.pluginDir, "DEPRECATION"), nil, 0o644); err != nil {
				return fmt.Errorf("create DEPRECATION file: %w", err)
			}
		}
	}
	r.emu = newEmulator(r.pluginDir, cfg.DialTimeout, r.log)
	if _, err := r.emu.start(); err != nil {
		return err
	}
	if cfg.PluginWatcher {
		w, err := pluginwatcher.New(pluginwatcher.Config{
			Dir:            r.registryDir,
			Handlers:       map[string]pluginwatcher.Handler{pluginwatcher.DevicePlugin: registryHandler{e: r.emu}},
			Logger:         r.log,
			InitialBackoff: 200 * time.Millisecond,
			DialTimeout:    cfg.DialTimeout,
			HealthPeriod:   -1,
		})
		if err != nil {
			return fmt.Errorf("plugin watcher: %w", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if err := w.Start(ctx); err != nil {
			cancel()
			return fmt.Errorf("plugin watcher: %w", err)
		}
		r.pw, r.pwCancel = w, cancel
	}
	r.start = time.Now()
	if len(cfg.Command) == 0 {
		return nil
	}
	// The directory as the plugin sees it: with a private mount, the
	// kubelet's fixed path, which is the emulated directory there.
	seen := r.pluginDir
	if cfg.PrivateMount {
		seen = filepath.Clean(pluginapi.DevicePluginPath)
	}
	r.seenDir = seen
	r.command = expandArgs(cfg.Command, seen, r.registryDir)
	sockDir := seen
	env := append(append([]string(nil), cfg.Env...), verifyproc.EnvPluginDir+"="+seen)
	if r.registryDir != "" {
		sockDir = r.registryDir
		env = append(env, verifyproc.EnvRegistryDir+"="+r.registryDir)
	}
	env = append(env, verifyproc.EnvSampleSockDir+"="+sockDir)
	var p *verifyproc.Process
	var err error
	if cfg.PrivateMount {
		p, err = verifyproc.StartInMount(r.command, env, r.pluginDir, pluginapi.DevicePluginPath)
	} else {
		p, err = verifyproc.Start(r.command, env)
	}
	if err != nil {
		return err
	}
	r.proc = p
	return nil
}

func (r *runner) cleanup() {
	if r.proc != nil {
		r.proc.Kill()
	}
	if r.stopWatch != nil {
		r.stopWatch()
	}
	if r.pwCancel != nil {
		r.pwCancel()
		<-r.pw.Done()
	}
	if r.emu != nil {
		r.emu.stop()
		if r.root == "" {
			_ = os.Remove(r.emu.sock)
		}
	}
	if r.root != "" {
		_ = os.RemoveAll(r.root)
	}
}

// set records a check's verdict.
func (r *runner) set(id string, v Verdict, format string, args ...any) {
	res := r.results[id]
	res.Verdict = v
	res.Detail = fmt.Sprintf(format, args...)
	r.log.Debug("Check done", "check", id, "verdict", v, "detail", res.Detail)
}

// final returns the result of check id as the report gives it: with the
// fix and the link to the docs when it failed or warned. The fix is the
// SDK's when the plugin is built on the SDK and the check has one.
func (r *runner) final(id string) Result {
	res := *r.results[id]
	if res.Verdict == Fail || res.Verdict == Warn {
		c := r.checks[id]
		res.Fix, res.Docs = c.Fix, c.DocsURL()
		if c.SDKFix != "" && r.sdk() {
			res.Fix = c.SDKFix
		}
	}
	return res
}

// sdk reports whether the plugin is built on dpkit's SDK: a connection of
// the run got the SDK's header with GetDevicePluginOptions.
func (r *runner) sdk() bool {
	if r.emu == nil {
		return false
	}
	r.emu.mu.Lock()
	defer r.emu.mu.Unlock()
	for _, c := range r.emu.history {
		if c.SDK != "" {
			return true
		}
	}
	return false
}

// report hands every decided check not reported yet to Config.Progress,
// in the order of Checks. It is called only where the verdicts decided so
// far are final: between steps (step turns what a failed or interrupted
// step decided into skips before it returns) and at the end.
func (r *runner) report() {
	for _, c := range Checks() {
		if r.results[c.ID].Verdict == "" || r.reported[c.ID] {
			continue
		}
		r.reported[c.ID] = true
		if r.cfg.Progress != nil {
			r.cfg.Progress(r.final(c.ID))
		}
	}
}

// skipAll skips every check not decided yet.
func (r *runner) skipAll(reason string, ids ...string) {
	for _, id := range ids {
		if r.results[id].Verdict == "" {
			r.set(id, Skip, "%s", reason)
		}
	}
}

// outcome gathers per-resource findings of one check.
type outcome struct {
	multi                       bool
	fails, warns, skips, passes []string
}

func (o *outcome) add(list *[]string, res, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if o.multi {
		msg = res + ": " + msg
	}
	*list = append(*list, msg)
}
func (o *outcome) fail(res, format string, args ...any) { o.add(&o.fails, res, format, args...) }
func (o *outcome) warn(res, format string, args ...any) { o.add(&o.warns, res, format, args...) }
func (o *outcome) skip(res, format string, args ...any) { o.add(&o.skips, res, format, args...) }
func (o *outcome) pass(res, format string, args ...any) { o.add(&o.passes, res, format, args...) }

func (r *runner) outcome() *outcome { return &outcome{multi: len(r.resources) > 1} }

func (r *runner) conclude(id string, o *outcome) {
	switch {
	case len(o.fails) > 0:
		r.set(id, Fail, "%s", strings.Join(o.fails, "; "))
	case len(o.warns) > 0:
		r.set(id, Warn, "%s", strings.Join(o.warns, "; "))
	case len(o.passes) > 0:
		r.set(id, Pass, "%s", strings.Join(o.passes, "; "))
	default:
		r.set(id, Skip, "%s", strings.Join(o.skips, "; "))
	}
}

// since formats a time relative to the start of the run.
func (r *runner) since(t time.Time) string {
	return "+" + t.Sub(r.start).Round(time.Millisecond).String()
}

func (r *runner) run(ctx context.Context) {
	registered := r.waitRegistered(ctx)
	if ctx.Err() != nil {
		return
	}
	if !registered {
		r.notRegistered(ctx)
		return
	}
	r.initial = r.registrationCounts(-1)
	wctx, cancel := context.WithCancel(context.Background())
	r.stopWatch = cancel
	r.openWatchers(wctx)

	steps := []struct {
		name string
		fn   func(context.Context)
	}{
		{"the first-message check", r.checkFirstMessage},
		{"the concurrent-streams check", r.checkStreams},
		{"the options check", r.checkOptions},
		{"the Allocate checks", r.checkAllocate},
		{"the GetPreferredAllocation checks", r.checkPreferred},
		{"the PreStartContainer check", r.checkPreStart},
		{"the health check", r.checkHealth},
		{"the plugin-watcher check", r.checkPluginWatcher},
		{"the restart checks", r.checkRestarts},
		{"the ListAndWatch message checks", r.checkMessages},
	}
	for _, s := range steps {
		ok := r.step(ctx, s.name, s.fn)
		r.report()
		if !ok {
			break
		}
	}
	if ctx.Err() != nil {
		return
	}
	r.checkRegistrations("")
	r.report()
	r.checkShutdown(ctx)
}

// deathGrace is how long a step that failed a check waits for the plugin's
// exit to show: a plugin that dies makes the check it was in fail (its
// stream ends, a call fails) a moment before its exit status arrives.
const deathGrace = 500 * time.Millisecond

// step runs one group of checks and reports whether the run goes on. One
// cause gives one failure: when the plugin exits during the step, the
// verdicts the step reached other than pass become skips that point at
// shutdown.exit, which fails; when the run is interrupted they become
// skips saying so. Either way the remaining steps are not run.
func (r *runner) step(ctx context.Context, name string, fn func(context.Context)) bool {
	if ctx.Err() != nil || r.stopped != "" {
		return false
	}
	if r.exited() {
		r.stopAfterExit("")
		return false
	}
	open := r.undecided()
	fn(ctx)
	if ctx.Err() != nil {
		r.undo(open, interrupted)
		return false
	}
	if r.proc != nil && r.failedAny(open) {
		r.proc.WaitExit(deathGrace)
	}
	if r.exited() {
		r.stopAfterExit(name)
		r.undo(open, r.stopped)
		return false
	}
	return true
}

// exited reports whether the plugin verify started has exited.
func (r *runner) exited() bool { return r.proc != nil && !r.proc.Running() }

// stopAfterExit records that the plugin exited, during the step named
// during ("" when it exited between steps).
func (r *runner) stopAfterExit(during string) {
	r.diedDuring = during
	r.stopped = fmt.Sprintf("the plugin %s at %s; see %s", r.proc.Exit(), r.since(r.proc.Exited()), CheckExit)
}

// undecided returns the checks without a verdict.
func (r *runner) undecided() []string {
	var out []string
	for id, res := range r.results {
		if res.Verdict == "" {
			out = append(out, id)
		}
	}
	return out
}

// failedAny reports whether one of ids failed.
func (r *runner) failedAny(ids []string) bool {
	for _, id := range ids {
		if r.results[id].Verdict == Fail {
			return true
		}
	}
	return false
}

// undo turns the verdicts of ids other than pass into skips with reason.
func (r *runner) undo(ids []string, reason string) {
	for _, id := range ids {
		if v := r.results[id].Verdict; v != "" && v != Pass {
			r.set(id, Skip, "%s", reason)
		}
	}
}

// notRegistered decides the checks of a run in which no registration was
// accepted: the registration checks say why, everything else is skipped.
// A plugin that exited before registering fails registration.serving only.
func (r *runner) notRegistered(ctx context.Context) {
	none := len(r.emu.registrations()) == 0
	reason := errNoPlugin.Error()
	var detail string
	switch {
	case r.exited() && none:
		detail = fmt.Sprintf("the plugin %s before registering", r.proc.Exit())
		reason = detail + "; see " + CheckServing
	case r.exited():
		reason = fmt.Sprintf("the plugin %s before a registration was accepted; see registration.*", r.proc.Exit())
	default:
		detail = fmt.Sprintf("none within %s; %s", r.cfg.RegisterTimeout, r.whereServed())
	}
	r.checkRegistrations(detail)
	r.skipAll(reason, CheckOptions, CheckFirstMessage, CheckFullList, CheckVanished, CheckDeviceIDs, CheckStreams, CheckHealth, CheckMessageSize,
		CheckResponses, CheckUnknown, CheckUnhealthy, CheckConcurrent, CheckEveryDevice, CheckPrefSize, CheckPrefMust, CheckPrefAvailable,
		CheckPreStart, CheckKubeletRestart, CheckSocketDeleted, CheckOldEndpoint, CheckSingleReg, CheckPluginWatcher)
	if r.exited() {
		r.skipAll(reason, CheckExit, CheckSocketRemoved)
		return
	}
	r.report()
	r.checkShutdown(ctx)
}

// whereServed says, for a plugin that has not registered, where it serves
// and how to make it register: the unix sockets its processes listen on
// (or, where those cannot be found out, the sockets in the emulated
// directories), and whether they are where verify's kubelet looks.
func (r *runner) whereServed() string {
	if r.proc == nil {
		return fmt.Sprintf("nothing called Register on %s. Fix: give the running plugin %s as its device plugin directory",
			r.emu.sock, r.pluginDir)
	}
	dir, how := r.seenDir, verifyproc.PlaceholderPluginDir+" in its arguments or $"+verifyproc.EnvPluginDir
	sdk := "$" + verifyproc.EnvPluginDir + " when Config.PluginDir is empty"
	if r.registry() {
		dir, how = r.registryDir, verifyproc.PlaceholderRegistryDir+" in its arguments or $"+verifyproc.EnvRegistryDir
		sdk = "$" + verifyproc.EnvRegistryDir + " when Config.RegistryDir is empty"
	}
	sockets, known := r.proc.ListeningSockets()
	if !known {
		sockets = r.socketsIn(r.pluginDir, r.registryDir)
	}
	var inside []string
	for _, s := range sockets {
		if filepath.Dir(s) == dir {
			inside = append(inside, s)
		}
	}
	switch {
	case len(inside) > 0 && r.registry():
		return fmt.Sprintf("the plugin listens on %s, but the plugin watcher got no answer there it could accept (run with --log-level debug to see its calls). Fix: serve the registration service (GetInfo: type DevicePlugin, your resource name, v1beta1) on that socket",
			strings.Join(inside, ", "))
	case len(inside) > 0:
		return fmt.Sprintf("the plugin listens on %s but did not call Register on %s. Fix: once the socket serves, call Register on kubelet.sock in the same directory",
			strings.Join(inside, ", "), filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)))
	case len(sockets) > 0:
		return fmt.Sprintf("the plugin listens on %s, outside the directory verify's kubelet serves, %s. Fix: take the directory from verify: %s (the dpkit SDK uses %s); as root, --private-mount runs a plugin that only knows %s",
			strings.Join(sockets, ", "), dir, how, sdk, filepath.Clean(pluginapi.DevicePluginPath))
	}
	what := "on no unix socket"
	if !known {
		what = "on no socket in " + dir
	}
	return fmt.Sprintf("the plugin listens %s. Fix: serve the device plugin API on a socket in the directory verify hands down (%s), then register",
		what, how)
}

// socketsIn returns the sockets in dirs but kubelet.sock.
func (r *runner) socketsIn(dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.Type()&os.ModeSocket != 0 && filepath.Join(d, e.Name()) != r.emu.sock {
				out = append(out, filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}

// waitRegistered waits for the first accepted registration, then for
// registrations to stop arriving, and records the resources.
func (r *runner) waitRegistered(ctx context.Context) bool {
	var exited <-chan struct{} = make(chan struct{})
	if r.proc != nil {
		exited = r.proc.Done()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			r.emu.broadcast()
		case <-wctx.Done():
		}
	}()
	ok := r.emu.waitFor(ctx, r.cfg.RegisterTimeout, func() bool {
		if r.proc != nil && !r.proc.Running() {
			return true
		}
		for _, reg := range r.emu.regs {
			if reg.Err == nil {
				return true
			}
		}
		return false
	})
	if !ok || len(r.registrationCounts(-1)) == 0 && r.exited() {
		return false
	}
	r.quiet(ctx)
	seen := map[string]bool{}
	for _, reg := range r.emu.registrations() {
		if reg.Err == nil && !seen[reg.Resource] {
			seen[reg.Resource] = true
			r.resources = append(r.resources, reg.Resource)
		}
	}
	sort.Strings(r.resources)
	return len(r.resources) > 0
}

// quiet waits until no registration arrived for QuietPeriod and none is
// still being handled (at most four periods in all, and the time one
// registration can take, so that a storm cannot stall the run).
func (r *runner) quiet(ctx context.Context) {
	deadline := time.Now().Add(4 * r.cfg.QuietPeriod)
	for time.Now().Before(deadline) {
		n := len(r.emu.registrations())
		more := r.emu.waitFor(ctx, r.cfg.QuietPeriod, func() bool { return len(r.emu.regs) > n || !r.emu.settled() })
		if !more {
			return
		}
		// One is being handled: wait until it is recorded, then for
		// another quiet period.
		r.emu.waitFor(ctx, r.cfg.DialTimeout+takeoverGrace+r.cfg.CallTimeout, r.emu.settled)
	}
}

// registrationCounts counts the registrations per resource in epoch
// (every epoch when epoch < 0) that restart.single-registration counts.
func (r *runner) registrationCounts(epoch int) map[string]int {
	out := map[string]int{}
	for _, reg := range r.emu.registrations() {
		if reg.counted() && (epoch < 0 || reg.Epoch == epoch) {
			out[reg.Resource]++
		}
	}
	return out
}

// checkRegistrations decides the registration.* checks from every
// registration seen. noneDetail says why there was none: then
// registration.serving fails and the other two, which have nothing to
// judge, are skipped.
func (r *runner) checkRegistrations(noneDetail string) {
	regs := r.emu.registrations()
	if len(regs) == 0 {
		r.set(CheckServing, Fail, "no Register call arrived: %s", noneDetail)
		r.skipAll("no Register call arrived; see "+CheckServing, CheckVersion, CheckResourceName)
		return
	}
	var notServing, badVersion, badName []string
	for _, reg := range regs {
		if reg.NotServing != nil {
			notServing = append(notServing, fmt.Sprintf("%s registered at %s before its socket %s answered (%v)", reg.Resource, r.since(reg.At), filepath.Base(reg.Endpoint), statusMessage(reg.NotServing)))
		}
		if err := validateRegistration(reg.Version, "example.com/x"); err != nil && reg.Via == viaKubeletSocket {
			badVersion = append(badVersion, "kubelet answered: "+err.Error())
		}
		if validateRegistration(pluginapi.Version, reg.Resource) != nil {
			badName = append(badName, fmt.Sprintf("kubelet answered: %s (%s)", kubeletreg.InvalidResourceName(reg.Resource), strings.Join(resourceNameProblems(reg.Resource), "; ")))
		}
	}
	verdict := func(id string, problems []string, ok string) {
		if len(problems) > 0 {
			r.set(id, Fail, "%s", strings.Join(dedupe(problems), "; "))
		} else {
			r.set(id, Pass, "%s", ok)
		}
	}
	verdict(CheckServing, notServing, fmt.Sprintf("%d registrations; the socket answered GetDevicePluginOptions every time", len(regs)))
	verdict(CheckVersion, badVersion, "every registration asked for "+pluginapi.Version)
	verdict(CheckResourceName, badName, "resources: "+strings.Join(r.names(regs), ", "))
}

func (r *runner) names(regs []registration) []string {
	seen := map[string]bool{}
	var out []string
	for _, reg := range regs {
		if !seen[reg.Resource] {
			seen[reg.Resource] = true
			out = append(out, reg.Resource)
		}
	}
	sort.Strings(out)
	return out
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// checkShutdown sends SIGTERM and checks the exit and the sockets.
func (r *runner) checkShutdown(ctx context.Context) {
	if r.proc == nil {
		r.skipAll("the plugin was already running (--socket-dir); verify does not stop it", CheckExit, CheckSocketRemoved)
		return
	}
	if r.exited() {
		// It died on its own: its sockets are expected to be left, and
		// only shutdown.exit fails.
		during := ""
		if r.diedDuring != "" {
			during = ", during " + r.diedDuring
		}
		r.set(CheckExit, Fail, "the plugin %s on its own at %s%s, before SIGTERM", r.proc.Exit(), r.since(r.proc.Exited()), during)
		r.set(CheckSocketRemoved, Skip, "the plugin exited on its own; see %s", CheckExit)
		return
	}
	sockets := r.pluginSockets()
	sent := time.Now()
	if err := r.proc.Signal(syscall.SIGTERM); err != nil {
		r.set(CheckExit, Fail, "could not send SIGTERM: %v", err)
	}
	t := time.NewTimer(r.cfg.TermTimeout)
	defer t.Stop()
	select {
	case <-r.proc.Done():
		r.set(CheckExit, Pass, "%s %s after SIGTERM", r.proc.Exit(), r.proc.Exited().Sub(sent).Round(time.Millisecond))
	case <-t.C:
		r.set(CheckExit, Fail, "still running %s after SIGTERM; killed", r.cfg.TermTimeout)
		r.proc.Kill()
		r.set(CheckSocketRemoved, Skip, "the plugin did not exit by itself; see %s", CheckExit)
		return
	case <-ctx.Done():
		// Run reports every undecided check as interrupted.
		return
	}
	if len(sockets) == 0 {
		r.set(CheckSocketRemoved, Skip, "no socket of the plugin existed when SIGTERM was sent")
		return
	}
	var left []string
	for _, s := range sockets {
		if _, err := os.Lstat(s); err == nil {
			left = append(left, filepath.Base(s))
		}
	}
	if len(left) > 0 {
		r.set(CheckSocketRemoved, Fail, "left behind: %s", strings.Join(left, ", "))
	} else {
		r.set(CheckSocketRemoved, Pass, "removed: %s", strings.Join(baseNames(sockets), ", "))
	}
}

// pluginSockets returns the sockets of accepted registrations that exist
// now.
func (r *runner) pluginSockets() []string {
	var out []string
	for _, reg := range r.emu.registrations() {
		if reg.Err == nil {
			out = append(out, reg.Endpoint)
		}
	}
	if r.pw != nil {
		for _, p := range r.pw.Plugins() {
			out = append(out, p.SocketPath)
		}
	}
	var existing []string
	for _, s := range dedupe(out) {
		if _, err := os.Lstat(s); err == nil {
			existing = append(existing, s)
		}
	}
	return existing
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

// expandArgs replaces the placeholders in args: {registry-dir} only
// where there is a registry directory.
func expandArgs(args []string, pluginDir, registryDir string) []string {
	vals := map[string]string{verifyproc.PlaceholderPluginDir: pluginDir}
	if registryDir != "" {
		vals[verifyproc.PlaceholderRegistryDir] = registryDir
	}
	return verifyproc.ExpandArgs(args, vals)
}
