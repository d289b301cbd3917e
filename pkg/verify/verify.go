// Package verify checks that a device plugin behaves the way the kubelet
// needs it to. It runs the plugin (or attaches to one that is running)
// against an emulated kubelet built for observation, drives it through
// registration, ListAndWatch, Allocate, GetPreferredAllocation,
// PreStartContainer, kubelet restarts and SIGTERM, and reports one verdict
// per check (see Checks and docs/verify.md).
//
//	report, err := verify.Run(ctx, verify.Config{Command: []string{"my-plugin", "--dir", "{plugin-dir}"}})
//	if err != nil { ... }           // the run could not be set up
//	report.WriteTable(os.Stdout)    // or WriteJSON, WriteJUnit
//	if report.Failed() { ... }
package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/internal/verifyproc"
)

// Verdict is the outcome of one check.
type Verdict string

// Verdicts.
const (
	Pass Verdict = "pass"
	Fail Verdict = "fail"
	Warn Verdict = "warn"
	Skip Verdict = "skip"
)

// Result is one check's outcome.
type Result struct {
	ID          string  `json:"id"`
	Description string  `json:"description"`
	Basis       string  `json:"basis"`
	Verdict     Verdict `json:"verdict"`
	// Detail says what was seen: the measured figure, the failure, or why
	// the check was skipped.
	Detail string `json:"detail,omitempty"`
	// Fix and Docs, set when the check failed or warned, say how to fix
	// the plugin and link to the check's section in docs/verify.md.
	Fix  string `json:"fix,omitempty"`
	Docs string `json:"docs,omitempty"`
}

// Summary counts verdicts.
type Summary struct {
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Warned  int `json:"warned"`
	Skipped int `json:"skipped"`
}

func (s Summary) String() string {
	out := fmt.Sprintf("%d passed, %d failed", s.Passed, s.Failed)
	if s.Warned > 0 {
		out += fmt.Sprintf(", %d warned", s.Warned)
	}
	return out + fmt.Sprintf(", %d skipped", s.Skipped)
}

// Report is the outcome of a run.
type Report struct {
	// Command is the plugin command as run (placeholders expanded); empty
	// for an already running plugin.
	Command []string `json:"command,omitempty"`
	// Mode is "kubelet.sock" or "plugins_registry" for a device plugin,
	// "dra" for a DRA driver.
	Mode string `json:"mode"`
	// PluginDir is the emulated kubelet's device plugin directory.
	PluginDir string `json:"pluginDir"`
	// Resources are the resources that registered.
	Resources []string `json:"resources"`
	// SDK is set when the plugin is built on dpkit's SDK
	// (pkg/deviceplugin): it answered GetDevicePluginOptions with the SDK's
	// header. The fixes of failed checks are then the SDK's where a check
	// has one (CheckInfo.SDKFix).
	SDK bool `json:"sdk,omitempty"`
	// Duration is how long the run took; in seconds in JSON and YAML.
	Duration time.Duration `json:"duration"`
	Results  []Result      `json:"results"`
	Summary  Summary       `json:"summary"`
	// PluginOutput is the end of what the plugin wrote, kept when a check
	// failed.
	PluginOutput string `json:"pluginOutput,omitempty"`
	// Interrupted is set when the run's context ended before every check
	// was done (Ctrl-C, SIGTERM): the unfinished checks are skipped with
	// the detail "interrupted".
	Interrupted bool `json:"interrupted,omitempty"`
}

// MarshalJSON gives Duration in seconds, as every duration dpkit prints.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(struct {
		plain
		Duration float64 `json:"duration"`
	}{plain(r), r.Duration.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Report) UnmarshalJSON(data []byte) error {
	type plain Report
	aux := struct {
		*plain
		Duration float64 `json:"duration"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(data, &aux); err != nil {
		return err
	}
	r.Duration = time.Duration(aux.Duration * float64(time.Second))
	return nil
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return r.Summary.Failed > 0 }

// Result returns the result of the check with id, or nil.
func (r *Report) Result(id string) *Result {
	for i := range r.Results {
		if r.Results[i].ID == id {
			return &r.Results[i]
		}
	}
	return nil
}

// Defaults of Config.
const (
	DefaultRegisterTimeout     = 10 * time.Second
	DefaultReregisterThreshold = 5 * time.Second
	DefaultReregisterWarn      = time.Second
	DefaultRestarts            = 3
	DefaultTermTimeout         = 10 * time.Second
	DefaultQuietPeriod         = time.Second
	DefaultCallTimeout         = 5 * time.Second
	DefaultDialTimeout         = 10 * time.Second
)

// Config configures a run.
type Config struct {
	// Command is the plugin command and its arguments. "{plugin-dir}" is
	// replaced with the emulated kubelet's device plugin directory and
	// "{registry-dir}" with its plugins_registry directory. Either Command
	// or SocketDir is required.
	Command []string
	// SocketDir verifies a plugin that is already running and registers
	// through SocketDir/kubelet.sock: the emulated kubelet serves there.
	// The checks that stop the plugin are skipped.
	SocketDir string
	// PrivateMount runs Command in its own mount namespace in which
	// /var/lib/kubelet/device-plugins is the emulated directory, for
	// plugins that only know that path. Needs root.
	PrivateMount bool
	// PluginWatcher creates a plugins_registry directory and registers the
	// plugin through the kubelet's plugin watcher instead of kubelet.sock.
	PluginWatcher bool
	// Env is the plugin's base environment. Default os.Environ().
	Env []string
	// RegisterTimeout bounds the wait for the first registration.
	RegisterTimeout time.Duration
	// ReregisterThreshold is the longest acceptable time to register again
	// after a kubelet restart or the removal of the plugin's socket.
	ReregisterThreshold time.Duration
	// ReregisterWarn is the re-registration time above which a check
	// warns: the node lacks the resource for that long.
	ReregisterWarn time.Duration
	// Restarts is how many kubelet restarts in a row are emulated.
	Restarts int
	// TermTimeout bounds the wait for the plugin to exit after SIGTERM.
	TermTimeout time.Duration
	// QuietPeriod is how long the verifier watches for further
	// registrations after one arrives (registration storms).
	QuietPeriod time.Duration
	// HealthWait is how long to wait for a device to change health so
	// that health updates can be observed. Zero observes only what
	// happens during the other checks.
	HealthWait time.Duration
	// CallTimeout bounds every RPC and the wait for ListAndWatch messages.
	CallTimeout time.Duration
	// DialTimeout is how long the emulated kubelet waits for a plugin's
	// socket inside Register (the kubelet's blocking dial: 10s).
	DialTimeout time.Duration
	// Logger receives debug logs of the run. Default: discard.
	Logger *slog.Logger
	// Progress, when set, is called with each check's result as soon as
	// its verdict is final, in the order checks are decided (registration.*
	// come last: they are judged from every registration of the run), from
	// the goroutine that called Run. Every check is reported once, the last
	// ones before Run returns.
	Progress func(Result)
}

func (c Config) withDefaults() Config {
	if c.RegisterTimeout == 0 {
		c.RegisterTimeout = DefaultRegisterTimeout
	}
	if c.ReregisterThreshold == 0 {
		c.ReregisterThreshold = DefaultReregisterThreshold
	}
	if c.ReregisterWarn == 0 {
		c.ReregisterWarn = DefaultReregisterWarn
	}
	if c.Restarts == 0 {
		c.Restarts = DefaultRestarts
	}
	if c.TermTimeout == 0 {
		c.TermTimeout = DefaultTermTimeout
	}
	if c.QuietPeriod == 0 {
		c.QuietPeriod = DefaultQuietPeriod
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem in c with its field path.
func (c Config) Validate() error { return c.Problems().ToAggregate() }

// Problems lists every problem in c with its field path (the name of the
// Config field, in lower camel case), for callers that report them in
// their own terms (dpkit verify names its flags).
func (c Config) Problems() field.ErrorList {
	var errs field.ErrorList
	switch {
	case len(c.Command) == 0 && c.SocketDir == "":
		errs = append(errs, field.Required(field.NewPath("command"), "give the plugin command, or SocketDir of a running plugin"))
	case len(c.Command) > 0 && c.SocketDir != "":
		errs = append(errs, field.Invalid(field.NewPath("socketDir"), c.SocketDir, "give either a command to run or SocketDir of a running plugin, not both"))
	}
	if c.SocketDir != "" && !filepath.IsAbs(c.SocketDir) {
		errs = append(errs, field.Invalid(field.NewPath("socketDir"), c.SocketDir, "must be an absolute path"))
	}
	if c.PrivateMount && c.SocketDir != "" {
		errs = append(errs, field.Invalid(field.NewPath("privateMount"), true, "only applies to a plugin command that verify starts"))
	}
	if c.PluginWatcher && c.SocketDir != "" {
		errs = append(errs, field.Invalid(field.NewPath("pluginWatcher"), true, "plugin-watcher mode needs a plugin command that verify starts"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"registerTimeout", c.RegisterTimeout}, {"reregisterThreshold", c.ReregisterThreshold}, {"reregisterWarn", c.ReregisterWarn},
		{"termTimeout", c.TermTimeout}, {"quietPeriod", c.QuietPeriod}, {"healthWait", c.HealthWait},
		{"callTimeout", c.CallTimeout}, {"dialTimeout", c.DialTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, field.Invalid(field.NewPath(d.name), d.v.String(), "must not be negative"))
		}
	}
	if c.Restarts < 0 {
		errs = append(errs, field.Invalid(field.NewPath("restarts"), c.Restarts, "must not be negative; 0 means the default, 3"))
	}
	return errs
}

// Run verifies the plugin cfg describes. The error is non-nil only when
// the run could not be set up (the plugin command could not be started,
// say); a misbehaving plugin gives a Report with failed checks. When ctx
// ends first, Run stops the plugin and returns at once with a Report that
// is Interrupted.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid verify configuration: %w", err)
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	r := &runner{cfg: cfg, log: cfg.Logger, results: make(map[string]*Result), checks: make(map[string]CheckInfo), reported: make(map[string]bool)}
	for _, c := range Checks() {
		r.checks[c.ID] = c
		r.results[c.ID] = &Result{ID: c.ID, Description: c.Description, Basis: c.Basis}
	}
	if err := r.setup(); err != nil {
		r.cleanup()
		return nil, err
	}
	defer r.cleanup()
	r.run(ctx)

	rep := &Report{Command: r.command, Mode: viaKubeletSocket, PluginDir: r.pluginDir, Resources: r.resources, SDK: r.sdk()}
	if cfg.PluginWatcher {
		rep.Mode = viaRegistry
	}
	rep.Interrupted = ctx.Err() != nil
	notReached := "not reached"
	switch {
	case rep.Interrupted:
		notReached = interrupted
	case r.stopped != "":
		notReached = r.stopped
	}
	for _, res := range r.results {
		if res.Verdict == "" {
			res.Verdict, res.Detail = Skip, notReached
		}
	}
	r.report()
	for _, c := range Checks() {
		res := r.final(c.ID)
		switch res.Verdict {
		case Pass:
			rep.Summary.Passed++
		case Fail:
			rep.Summary.Failed++
		case Warn:
			rep.Summary.Warned++
		case Skip:
			rep.Summary.Skipped++
		}
		rep.Results = append(rep.Results, res)
	}
	if rep.Failed() && r.proc != nil {
		rep.PluginOutput = r.proc.Output()
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// errNoPlugin is the detail of checks that need a registered plugin.
var errNoPlugin = errors.New("no registration was accepted; see registration.*")

// interrupted is the detail of the checks an interrupted run did not finish.
const interrupted = "interrupted"

// ErrNotRoot is returned when PrivateMount is asked for without root.
var ErrNotRoot = verifyproc.ErrNotRoot
