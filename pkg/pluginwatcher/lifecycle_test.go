package pluginwatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/pluginwatcher/pwtest"
)

func wantOps(t *testing.T, h *pwtest.Handler, want ...string) []pwtest.Call {
	t.Helper()
	calls, err := h.WaitCalls(waitCtx(t), len(want))
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Ops(); !slices.Equal(got, want) {
		t.Fatalf("handler calls = %v, want %v", got, want)
	}
	return calls
}

func TestDeregistrationOnRemoval(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		socket string
		remove func(t *testing.T, dir string, p *pwtest.Plugin)
	}{
		{"socket removed", "a.sock", func(t *testing.T, _ string, p *pwtest.Plugin) { p.Close() }},
		{"socket renamed away", "a.sock", func(t *testing.T, dir string, p *pwtest.Plugin) {
			if err := p.MoveTo(filepath.Join(dir, ".old.sock")); err != nil {
				t.Fatal(err)
			}
		}},
		{"subdirectory removed", "sub/a.sock", func(t *testing.T, dir string, _ *pwtest.Plugin) {
			if err := os.RemoveAll(filepath.Join(dir, "sub")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := testdir.Short(t, "pw")
			h := &pwtest.Handler{}
			w := startWatcher(t, Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}})
			socket := filepath.Join(dir, tc.socket)
			p := startPlugin(t, socket, devicePluginInfo("example.com/a", "a-endpoint.sock"))
			if _, err := p.WaitStatuses(waitCtx(t), 1); err != nil {
				t.Fatal(err)
			}
			if n := len(w.Plugins()); n != 1 {
				t.Fatalf("%d plugins registered, want 1", n)
			}
			tc.remove(t, dir, p)
			calls := wantOps(t, h, "validate", "register", "deregister")
			if c := calls[2]; c.Name != "example.com/a" || c.Endpoint != "a-endpoint.sock" {
				t.Errorf("DeRegisterPlugin(%q, %q), want (example.com/a, a-endpoint.sock)", c.Name, c.Endpoint)
			}
			if got := w.Plugins(); len(got) != 0 {
				t.Errorf("Plugins() after deregistration = %+v, want none", got)
			}
		})
	}
}

func TestReRegistration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// recreate returns the plugin now serving socket.
		recreate func(t *testing.T, dir, socket string, old *pwtest.Plugin) *pwtest.Plugin
	}{
		{"socket removed and created again", func(t *testing.T, _, socket string, old *pwtest.Plugin) *pwtest.Plugin {
			old.Close()
			return startPlugin(t, socket, devicePluginInfo("example.com/a", "v2.sock"))
		}},
		{"socket replaced by rename", func(t *testing.T, dir, socket string, _ *pwtest.Plugin) *pwtest.Plugin {
			p := startPlugin(t, filepath.Join(dir, ".tmp.sock"), devicePluginInfo("example.com/a", "v2.sock"))
			if err := p.MoveTo(socket); err != nil {
				t.Fatal(err)
			}
			return p
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := testdir.Short(t, "pw")
			h := &pwtest.Handler{}
			w := startWatcher(t, Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}})
			socket := filepath.Join(dir, "a.sock")
			p := startPlugin(t, socket, devicePluginInfo("example.com/a", "v1.sock"))
			wantOps(t, h, "validate", "register")
			// The plugin hears it is registered once the watcher has
			// recorded it (the handler's call comes just before).
			if _, err := p.WaitStatuses(waitCtx(t), 1); err != nil {
				t.Fatal(err)
			}
			first := w.Plugins()

			second := tc.recreate(t, dir, socket, p)
			calls := wantOps(t, h, "validate", "register", "deregister", "validate", "register")
			if calls[2].Endpoint != "v1.sock" || calls[4].Endpoint != "v2.sock" {
				t.Errorf("deregistered %q and registered %q, want v1.sock then v2.sock", calls[2].Endpoint, calls[4].Endpoint)
			}
			// As above: recorded by the watcher once the plugin hears it.
			if _, err := second.WaitStatuses(waitCtx(t), 1); err != nil {
				t.Fatal(err)
			}
			got := w.Plugins()
			if len(got) != 1 || got[0].Endpoint != "v2.sock" || len(first) != 1 || got[0].Seen.Before(first[0].Seen) {
				t.Errorf("Plugins() = %+v after %+v, want the v2.sock plugin", got, first)
			}
		})
	}
}

// listenUnix creates a socket nobody serves gRPC on.
func listenUnix(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
}

func desiredPaths(w *Watcher) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for p := range w.desired {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func TestInitialScanAndIgnoredFiles(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	a := filepath.Join(dir, "a.sock")
	b := filepath.Join(dir, "vendor", "b.sock")
	pa := startPlugin(t, a, devicePluginInfo("example.com/a", ""))
	pb := startPlugin(t, b, devicePluginInfo("example.com/b", ""))
	// Present before start and ignored: a dot socket, a socket in a dot
	// directory and a regular file.
	listenUnix(t, filepath.Join(dir, ".hidden.sock"))
	listenUnix(t, filepath.Join(dir, ".d", "c.sock"))
	if err := os.WriteFile(filepath.Join(dir, "regular.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	h := &pwtest.Handler{}
	w := startWatcher(t, Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}})
	// The initial scan is done when Start returns.
	if got, want := desiredPaths(w), []string{a, b}; !slices.Equal(got, want) {
		t.Errorf("sockets after the initial scan = %v, want %v", got, want)
	}
	for _, p := range []*pwtest.Plugin{pa, pb} {
		if _, err := p.WaitStatuses(waitCtx(t), 1); err != nil {
			t.Fatal(err)
		}
	}

	// Created after start and ignored. Events are handled in order, so once
	// the socket created last is seen, the others were handled.
	listenUnix(t, filepath.Join(dir, ".hidden2.sock"))
	if err := os.WriteFile(filepath.Join(dir, "regular2.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}
	last := filepath.Join(dir, "last.sock")
	pl := startPlugin(t, last, devicePluginInfo("example.com/last", ""))
	if _, err := pl.WaitStatuses(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	if got, want := desiredPaths(w), []string{a, last, b}; !slices.Equal(got, want) {
		t.Errorf("sockets = %v, want %v", got, want)
	}
	var names []string
	for _, p := range w.Plugins() {
		names = append(names, p.Name)
	}
	if want := []string{"example.com/a", "example.com/last", "example.com/b"}; !slices.Equal(names, want) {
		t.Errorf("registered plugins = %v, want %v", names, want)
	}
}

func TestHandlerAddedAfterUnknownType(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	w := startWatcher(t, Config{Dir: dir, InitialBackoff: time.Hour})
	p := startPlugin(t, filepath.Join(dir, "dra.sock"), &registerapi.PluginInfo{Type: DRAPlugin, Name: "dra.example.com", SupportedVersions: []string{"v1"}})
	st, err := p.WaitStatuses(waitCtx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if st[0].PluginRegistered || !strings.Contains(st[0].Error, "no handler registered for plugin type: DRAPlugin") {
		t.Fatalf("status = %+v, want a no-handler error", st[0])
	}
	if f := w.Failures(); len(f) != 1 || !strings.Contains(f[0].LastError, ErrNoHandler.Error()) {
		t.Fatalf("Failures() = %+v", f)
	}
	h := &pwtest.Handler{}
	if err := w.AddHandler(DRAPlugin, h); err != nil {
		t.Fatal(err)
	}
	// Retried at once despite the hour-long back-off.
	st, err = p.WaitStatuses(waitCtx(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	if !st[1].PluginRegistered {
		t.Errorf("second status = %+v, want registered", st[1])
	}
	wantOps(t, h, "validate", "register")
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	socket := filepath.Join(dir, "a.sock")
	startPlugin(t, socket, devicePluginInfo("example.com/a", ""))
	info, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	reject := make(chan bool, 1)
	reject <- true
	h := &pwtest.Handler{ValidateErr: func(string, string, []string) error {
		r := <-reject
		reject <- r
		if r {
			return pwtest.ErrRejected
		}
		return nil
	}}
	// The watcher is not started: the test drives reconcile passes itself.
	w, err := New(Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.addDesired(socket, info)
	pass := func(step time.Duration) int {
		clk.Step(step)
		w.reconcile(ctx)
		w.ops.Wait()
		return len(h.Calls())
	}

	steps := []struct {
		step      time.Duration
		wantCalls int
		wantNext  time.Duration // after t0, of the failure's next attempt
	}{
		{0, 1, 500 * time.Millisecond},
		{499 * time.Millisecond, 1, 500 * time.Millisecond},
		{time.Millisecond, 2, 1500 * time.Millisecond},
		{999 * time.Millisecond, 2, 1500 * time.Millisecond},
		{time.Millisecond, 3, 3500 * time.Millisecond},
		{2 * time.Second, 4, 7500 * time.Millisecond},
	}
	for i, s := range steps {
		if got := pass(s.step); got != s.wantCalls {
			t.Fatalf("step %d: %d attempts, want %d", i, got, s.wantCalls)
		}
		f := w.Failures()
		if len(f) != 1 || f[0].Failures != s.wantCalls || !f[0].NextAttempt.Equal(t0.Add(s.wantNext)) {
			t.Fatalf("step %d: Failures() = %+v, want %d failures and next attempt at t0+%v", i, f, s.wantCalls, s.wantNext)
		}
	}

	// A re-created socket is a new plugin: it is tried at once.
	w.removeDesired(socket)
	w.addDesired(socket, info)
	if got := pass(0); got != 5 {
		t.Fatalf("re-created socket: %d attempts, want 5", got)
	}
	if f := w.Failures(); len(f) != 1 || f[0].Failures != 1 {
		t.Fatalf("Failures() after re-creation = %+v, want a first failure", f)
	}

	// Success clears the back-off.
	<-reject
	reject <- false
	if got := pass(500 * time.Millisecond); got != 7 {
		t.Fatalf("%d calls, want 7 (validate and register)", got)
	}
	if f := w.Failures(); len(f) != 0 {
		t.Errorf("Failures() after success = %+v, want none", f)
	}
	if p := w.Plugins(); len(p) != 1 {
		t.Errorf("Plugins() = %+v, want one", p)
	}
}

func TestBackoffDurations(t *testing.T) {
	t.Parallel()
	w, err := New(Config{Dir: "x"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		failures int
		want     time.Duration
	}{
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{3, 2 * time.Second},
		{8, 64 * time.Second},
		{9, DefaultMaxBackoff},
		{100, DefaultMaxBackoff},
	}
	for _, tc := range tests {
		if got := w.backoff(tc.failures); got != tc.want {
			t.Errorf("backoff(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none means valid
	}{
		{"minimal", Config{Dir: "/r/plugins_registry"}, nil},
		{"no dir", Config{}, []string{"dir: Required value"}},
		{"everything wrong", Config{
			Handlers:        map[string]Handler{"": &pwtest.Handler{}, DevicePlugin: nil},
			ReconcilePeriod: -1,
			DialTimeout:     -time.Second,
			InitialBackoff:  time.Second,
			MaxBackoff:      time.Millisecond,
		}, []string{"dir: Required", `handlers[]: Invalid`, `handlers[DevicePlugin]: Required`, "reconcilePeriod: Invalid", "dialTimeout: Invalid", "maxBackoff: Invalid"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, missing %q", err, w)
				}
			}
			if _, nerr := New(tc.cfg); nerr == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
}

func TestStartTwiceAndBadDir(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	created := filepath.Join(dir, "plugins_registry")
	w := startWatcher(t, Config{Dir: created})
	// Created like the kubelet creates it: no access for others.
	if fi, err := os.Stat(created); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("created %s with %v (%v), want 0750", created, fi.Mode().Perm(), err)
	}
	if err := w.Start(context.Background()); !errors.Is(err, ErrAlreadyStarted) {
		t.Errorf("second Start = %v, want ErrAlreadyStarted", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w2, err := New(Config{Dir: filepath.Join(file, "sub")})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Run(context.Background()); err == nil {
		t.Error("Run on a directory below a file succeeded")
	}
	<-w2.Done()
}

func TestHealthCheck(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	socket := filepath.Join(dir, "a.sock")
	p := startPlugin(t, socket, devicePluginInfo("example.com/a", ""))
	info, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := &pwtest.Handler{}
	// Not started: the test drives reconcile passes itself.
	w, err := New(Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pass := func(step time.Duration) {
		clk.Step(step)
		w.reconcile(ctx)
		w.ops.Wait()
	}
	registered := func() bool { return len(w.Plugins()) == 1 }

	w.addDesired(socket, info)
	pass(0)
	if !registered() || p.GetInfoCalls() != 1 {
		t.Fatalf("not registered (calls %v, GetInfo %d)", h.Ops(), p.GetInfoCalls())
	}
	pass(DefaultHealthPeriod - time.Millisecond)
	if p.GetInfoCalls() != 1 {
		t.Fatalf("health check before the period: %d GetInfo calls", p.GetInfoCalls())
	}
	pass(time.Millisecond)
	if p.GetInfoCalls() != 2 || !registered() {
		t.Fatalf("after one period: %d GetInfo calls, registered %v; want 2, true", p.GetInfoCalls(), registered())
	}

	p.SetFailing(true)
	pass(DefaultHealthPeriod)
	pass(0)
	if !registered() {
		t.Fatal("deregistered after a single failed health check")
	}
	pass(DefaultHealthPeriod)
	pass(0) // the reconciler sees the socket gone from the desired state
	if registered() {
		t.Fatal("still registered after two failed health checks")
	}
	if got, want := h.Ops(), []string{"validate", "register", "deregister"}; !slices.Equal(got, want) {
		t.Fatalf("handler calls = %v, want %v", got, want)
	}
	if f := w.Failures(); len(f) != 1 || f[0].SocketPath != socket || !strings.Contains(f[0].LastError, "plugin set to fail") {
		t.Fatalf("Failures() = %+v, want the dead socket", f)
	}

	pass(DefaultHealthPeriod) // probed, still failing
	pass(0)
	if registered() || len(h.Calls()) != 3 {
		t.Fatalf("a failing plugin came back: %v", h.Ops())
	}
	p.SetFailing(false)
	pass(DefaultHealthPeriod) // probed, answers
	pass(0)
	if !registered() {
		t.Fatal("not registered again after the plugin answered")
	}
	if got, want := h.Ops(), []string{"validate", "register", "deregister", "validate", "register"}; !slices.Equal(got, want) {
		t.Fatalf("handler calls = %v, want %v", got, want)
	}
	if f := w.Failures(); len(f) != 0 {
		t.Errorf("Failures() = %+v, want none", f)
	}

	// A dead socket that is removed is forgotten.
	p.SetFailing(true)
	pass(DefaultHealthPeriod)
	pass(DefaultHealthPeriod)
	pass(0)
	if registered() || len(w.Failures()) != 1 {
		t.Fatalf("plugin not marked dead: registered %v, failures %+v", registered(), w.Failures())
	}
	w.removeDesired(socket)
	if f := w.Failures(); len(f) != 0 {
		t.Errorf("Failures() after removal = %+v, want none", f)
	}
}

func TestHealthCheckDisabled(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pw")
	socket := filepath.Join(dir, "a.sock")
	p := startPlugin(t, socket, devicePluginInfo("example.com/a", ""))
	info, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := New(Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: &pwtest.Handler{}}, Clock: clk, HealthPeriod: -1})
	if err != nil {
		t.Fatal(err)
	}
	w.addDesired(socket, info)
	for range 3 {
		w.reconcile(context.Background())
		w.ops.Wait()
		clk.Step(time.Hour)
	}
	if n := p.GetInfoCalls(); n != 1 {
		t.Errorf("%d GetInfo calls with health checks off, want 1 (registration)", n)
	}
}

// staleSocket leaves a socket file at path that nobody listens on, as a
// plugin killed with SIGKILL does.
func staleSocket(t *testing.T, path string) os.FileInfo {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestStaleSocketsForgotten: 50 socket files left by crashed plugins are
// forgotten after RefusedLimit refused attempts each, while a live plugin
// beside them stays registered; no goroutine is left behind; a registered
// plugin whose process dies (its socket stays but refuses connections) is
// deregistered and forgotten instead of probed forever. Not parallel: it
// counts goroutines.
func TestStaleSocketsForgotten(t *testing.T) {
	dir := testdir.Short(t, "pw")
	live := filepath.Join(dir, "live.sock")
	p := startPlugin(t, live, devicePluginInfo("example.com/live", ""))
	const stale = 50
	infos := map[string]os.FileInfo{}
	for i := range stale {
		path := filepath.Join(dir, fmt.Sprintf("crashed-%d.sock", i))
		infos[path] = staleSocket(t, path)
	}
	liveInfo, err := os.Lstat(live)
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()

	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := &pwtest.Handler{}
	w, err := New(Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}, Clock: clk, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pass := func(step time.Duration) {
		clk.Step(step)
		w.reconcile(ctx)
		w.ops.Wait()
	}
	w.addDesired(live, liveInfo)
	for path, info := range infos {
		w.addDesired(path, info)
	}
	for i := range RefusedLimit {
		pass(w.backoff(i + 1))
	}
	if got := desiredPaths(w); !slices.Equal(got, []string{live}) {
		t.Fatalf("desired after %d refused attempts: %d sockets %v; want only %s", RefusedLimit, len(got), got, live)
	}
	if f := w.Failures(); len(f) != 0 {
		t.Fatalf("Failures() = %d entries, want none: the stale sockets are forgotten", len(f))
	}
	if got := w.Plugins(); len(got) != 1 || got[0].SocketPath != live {
		t.Fatalf("Plugins() = %+v, want the live plugin", got)
	}
	// Nothing more is attempted on the forgotten sockets.
	calls := len(h.Calls())
	pass(DefaultMaxBackoff)
	if len(h.Calls()) != calls {
		t.Fatalf("handler called again: %v", h.Ops()[calls:])
	}
	if err := goleak.Find(before); err != nil {
		t.Fatalf("goroutines left after forgetting the stale sockets: %v", err)
	}

	// The live plugin dies and leaves its socket file behind.
	keep := live + ".keep"
	if err := os.Link(live, keep); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := os.Rename(keep, live); err != nil {
		t.Fatal(err)
	}
	pass(DefaultHealthPeriod) // health check: refused
	pass(0)                   // deregistered
	if len(w.Plugins()) != 0 {
		t.Fatalf("a plugin whose socket refuses connections is still registered: %+v", w.Plugins())
	}
	if got, f := desiredPaths(w), w.Failures(); len(got) != 0 || len(f) != 0 {
		t.Fatalf("dead plugin's socket not forgotten: desired %v, failures %+v", got, f)
	}
}
