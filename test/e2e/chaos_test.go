package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// The lifecycle chaos run on dpkit node (docs/reliability.md): while pods
// asking for a device are created and deleted continuously, the node and
// its device plugin go through restarts, and each event kind is counted
// with what it cost the pods. It runs the same events against four
// configurations: dpkit's plugin (which re-registers within milliseconds
// of the node's registration socket coming back) and a plugin that comes
// back 10 s late, as the upstream example's re-registration does; each
// with the node's admission hold (--device-admission-wait) off, the
// kubelet's behaviour, and on.
//
// DPKIT_CHAOS_EVENTS is the number of events of each kind per
// configuration: 1 (the short mode CI runs) unless set; make chaos sets
// more. DPKIT_CHAOS_REPORT, when set, is a file the table is written to.

// chaosKinds are the event kinds, run in turn.
var chaosKinds = []string{"node restart", "plugin restart", "reboot"}

// chaosConfig is one configuration of the run.
type chaosConfig struct {
	name string
	// pluginDelay is how long after the node is back (or after it
	// stopped, for a plugin restart) the plugin starts again.
	pluginDelay time.Duration
	// pluginFollows: the plugin keeps running across a restart of the
	// node and re-registers by itself (dpkit's SDK); otherwise it stops
	// with the node and starts pluginDelay after it.
	pluginFollows bool
	hold          time.Duration
}

func TestChaosVirtualNode(t *testing.T) {
	events := chaosEvents(t)
	cp := cluster.Get(t)
	configs := []chaosConfig{
		{name: "dpkit plugin", pluginFollows: true},
		{name: "dpkit plugin, admission hold", pluginFollows: true, hold: 5 * time.Minute},
		{name: "plugin back after 10s", pluginDelay: 10 * time.Second},
		{name: "plugin back after 10s, admission hold", pluginDelay: 10 * time.Second, hold: 5 * time.Minute},
	}
	var report strings.Builder
	fmt.Fprintf(&report, "| configuration | event | events | pods failed at admission | other pod failures | devices held twice | allocatable whole again (max) |\n|---|---|---|---|---|---|---|\n")
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			rows := runChaos(t, cp.Kubeconfig, cp.ClientCAFile, cp.Client(), cfg, events)
			for _, r := range rows {
				fmt.Fprintf(&report, "| %s | %s | %d | %d | %d | %d | %s |\n", cfg.name, r.kind, r.events, r.admission, r.other, r.heldTwice, r.recovery.Round(10*time.Millisecond))
			}
			if cfg.hold > 0 {
				for _, r := range rows {
					if r.admission > 0 {
						t.Errorf("%s: %d pods failed at admission with the admission hold on", r.kind, r.admission)
					}
				}
			}
			for _, r := range rows {
				if r.heldTwice > 0 {
					t.Errorf("%s: a device was held by two pods %d times", r.kind, r.heldTwice)
				}
			}
		})
	}
	t.Logf("lifecycle chaos, %d event(s) of each kind per configuration:\n%s", events, report.String())
	writeChaosReport(t, "", report.String())
}

// chaosEvents is DPKIT_CHAOS_EVENTS, the number of events of each kind: 1
// (the short mode the suite runs) unless set.
func chaosEvents(t *testing.T) int {
	t.Helper()
	v := os.Getenv("DPKIT_CHAOS_EVENTS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("DPKIT_CHAOS_EVENTS=%q: want a positive number of events per kind", v)
	}
	return n
}

// writeChaosReport writes a run's table to DPKIT_CHAOS_REPORT when set,
// with suffix before its extension ("bin/chaos.md", "-realnode":
// bin/chaos-realnode.md).
func writeChaosReport(t *testing.T, suffix, table string) {
	path := os.Getenv("DPKIT_CHAOS_REPORT")
	if path == "" {
		return
	}
	ext := filepath.Ext(path)
	path = strings.TrimSuffix(path, ext) + suffix + ext
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Error(err)
	}
}

// chaosCounts are the pods that ended, by how, and what was seen on the
// way.
type chaosCounts struct {
	ok int
	// admission: failed at admission (UnexpectedAdmissionError,
	// TopologyAffinityError).
	admission int
	// noDevice: ran without the device it asked for (its command exits
	// chaosNoDevice).
	noDevice int
	// other: any other failure (a reboot kills the pods that ran).
	other int
	// prepareFailed: pods whose claim preparation failed at least once
	// (the kubelet's FailedPrepareDynamicResources; it tries again).
	prepareFailed int
	// heldTwice: PodResources snapshots listing one device for two pods.
	heldTwice int
}

func (a chaosCounts) String() string {
	return fmt.Sprintf("%d pods ended, %d failed at admission, %d claim preparations failed, %d ran without device, %d other failures, %d held twice",
		a.ended(), a.admission, a.prepareFailed, a.noDevice, a.other, a.heldTwice)
}

func (a chaosCounts) ended() int { return a.ok + a.admission + a.noDevice + a.other }

func (a chaosCounts) minus(b chaosCounts) chaosCounts {
	return chaosCounts{ok: a.ok - b.ok, admission: a.admission - b.admission, noDevice: a.noDevice - b.noDevice,
		other: a.other - b.other, prepareFailed: a.prepareFailed - b.prepareFailed, heldTwice: a.heldTwice - b.heldTwice}
}

func (a chaosCounts) plus(b chaosCounts) chaosCounts {
	return chaosCounts{ok: a.ok + b.ok, admission: a.admission + b.admission, noDevice: a.noDevice + b.noDevice,
		other: a.other + b.other, prepareFailed: a.prepareFailed + b.prepareFailed, heldTwice: a.heldTwice + b.heldTwice}
}

// chaosNoDevice is the exit code of a chaos pod that did not find the
// device it asked for.
const chaosNoDevice = 3

// chaosKindsSelected is kinds less those DPKIT_CHAOS_KINDS, a regular
// expression matched against each kind's name as go test -run matches a
// test's ("reboot|front", "kubelet"), leaves out; it skips the test
// when none is left. Unset, it keeps every kind.
func chaosKindsSelected(t *testing.T, kinds []string) []string {
	t.Helper()
	expr := os.Getenv("DPKIT_CHAOS_KINDS")
	if expr == "" {
		return kinds
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		t.Fatalf("DPKIT_CHAOS_KINDS=%q: not a regular expression (%v); name the event kinds to run, as in \"reboot|front switch\"", expr, err)
	}
	kinds = slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return !re.MatchString(k) })
	if len(kinds) == 0 {
		t.Skipf("DPKIT_CHAOS_KINDS=%q matches no event kind of this configuration", expr)
	}
	return kinds
}

// chaosRow is what one event kind cost in one configuration: the pods
// that ended in the windows around its events.
type chaosRow struct {
	kind   string
	events int
	chaosCounts
	recovery time.Duration // the longest until allocatable was whole
}

// chaosRounds runs events rounds of the kinds, one event of each in
// turn per round, while load runs (so a kind meets the node as the others
// left it, and no event's effect, a crash loop's growing back-off, adds
// up round after round). Around each event three pods end before it (so
// pods are in flight) and three after the node is whole again (so pods
// bound around the event meet admission); a kind's row counts what the
// pods that ended in those windows cost, and the longest time from an
// event until whole held.
func chaosRounds(t *testing.T, ctx context.Context, load *chaosLoad, kinds []string, events int, event func(kind string), whole func(context.Context) (bool, string, error)) []chaosRow {
	t.Helper()
	threeEnd := func(what string) {
		before := load.counts().ended()
		poll(t, ctx, what, func(context.Context) (bool, string, error) {
			ended := load.counts().ended() - before
			return ended >= 3, fmt.Sprintf("%d ended", ended), nil
		})
	}
	kinds = chaosKindsSelected(t, kinds)
	// Also when the run is cut short (t.Fatal): what failed, and which
	// device two pods held.
	defer func() {
		load.mu.Lock()
		defer load.mu.Unlock()
		if len(load.failures) > 0 {
			t.Logf("pods that failed: %s", strings.Join(load.failures, "; "))
		}
	}()
	rows := make([]chaosRow, len(kinds))
	for i, kind := range kinds {
		rows[i].kind = kind
	}
	for round := range events {
		for i, kind := range kinds {
			row := &rows[i]
			threeEnd("pods ended before a " + kind)
			before := load.counts()
			start := time.Now()
			event(kind)
			// What was missing on the way, and when it came back.
			var steps []string
			last := ""
			poll(t, ctx, "the node whole again after a "+kind, func(ctx context.Context) (bool, string, error) {
				ok, state, err := whole(ctx)
				if state != last {
					steps = append(steps, fmt.Sprintf("%v: %s", time.Since(start).Round(10*time.Millisecond), state))
					last = state
				}
				return ok, state, err
			})
			took := time.Since(start)
			t.Logf("round %d, %s: whole again after %v; on the way: %s", round+1, kind, took.Round(10*time.Millisecond), strings.Join(steps, "; "))
			row.recovery = max(row.recovery, took)
			threeEnd("pods ended after a " + kind)
			d := load.counts().minus(before)
			row.chaosCounts = row.plus(d)
			row.events++
			// The row so far: a long run cut short still has its figures.
			t.Logf("round %d, %s: this event %s; the %d so far %s", round+1, kind, d, row.events, row.chaosCounts)
		}
	}
	return rows
}

// chaosNode is the node and plugin the events act on.
type chaosNode struct {
	t     *testing.T
	ctx   context.Context
	c     kubernetes.Interface
	o     noderun.Options
	cfg   chaosConfig
	node  *virtualnode.Node
	stopN func()
	stopP func()
}

func (n *chaosNode) startNode() { n.node, n.stopN = runNode(n.t, n.ctx, n.o) }

func (n *chaosNode) startPlugin() { n.stopP = runFakePlugin(n.t, n.ctx, n.o.Root) }

// later runs f after d, or at once when d is 0.
func later(ctx context.Context, d time.Duration, f func()) {
	if d > 0 {
		select {
		case <-time.After(d): // the plugin's own delay, part of the scenario
		case <-ctx.Done():
			return
		}
	}
	f()
}

// event runs one event of kind and returns when it is over (what was
// stopped is started again); the node's recovery is awaited after.
func (n *chaosNode) event(kind string) {
	switch kind {
	case "node restart":
		// SIGTERM: the node stops, its pods' processes keep running.
		n.stopN()
		if !n.cfg.pluginFollows {
			n.stopP()
		}
		n.startNode()
		if !n.cfg.pluginFollows {
			later(n.ctx, n.cfg.pluginDelay, n.startPlugin)
		}
	case "plugin restart":
		n.stopP()
		later(n.ctx, n.cfg.pluginDelay, n.startPlugin)
	case "reboot":
		// Everything stops, the pods' processes too; the plugin (a
		// DaemonSet's pod) starts after the node, as on a real boot.
		n.stopP()
		n.stopN()
		stopProcessPods(n.t, n.o.Root)
		n.startNode()
		later(n.ctx, n.cfg.pluginDelay, n.startPlugin)
	}
}

// allocatableWhole reports whether the device manager serves all 8
// example.com/foo again.
func (n *chaosNode) allocatableWhole(context.Context) (bool, string, error) {
	for _, r := range n.node.DeviceManager().Resources() {
		if r.Name == string(foo) {
			return r.Connected && r.Allocatable == 8, fmt.Sprintf("connected %v, allocatable %d", r.Connected, r.Allocatable), nil
		}
	}
	return false, "not served", nil
}

// chaosLoad classifies the chaos pods as they end, and counts what it
// sees of the devices.
type chaosLoad struct {
	mu sync.Mutex
	chaosCounts
	failures []string
	// prepareFailedPods are the pods counted in prepareFailed.
	prepareFailedPods map[string]bool
}

// counts returns the counts so far.
func (l *chaosLoad) counts() chaosCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chaosCounts
}

func runChaos(t *testing.T, kubeconfig, clientCA string, c kubernetes.Interface, cfg chaosConfig, events int) []chaosRow {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(events)*time.Duration(len(chaosKinds))*2*time.Minute+5*time.Minute)
	defer cancel()
	root := testdir.Short(t, "vn")
	name := unique("vn-chaos")
	o := nodeOptions(kubeconfig, clientCA, name, root, "127.0.0.1", freePort(t))
	o.DeviceAdmissionWait = cfg.hold
	n := &chaosNode{t: t, ctx: ctx, c: c, o: o, cfg: cfg}
	n.startNode()
	n.startPlugin()
	poll(t, ctx, "8 example.com/foo served", n.allocatableWhole)
	ns := createNamespace(t, c, "chaos")

	load := &chaosLoad{}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); load.run(lctx, t, c, ns, name) }()
	go func() { defer wg.Done(); load.watchDevices(lctx, root) }()
	defer func() { stopLoad(); wg.Wait() }()
	return chaosRounds(t, ctx, load, chaosKinds, events, n.event, n.allocatableWhole)
}

// run keeps 4 pods in flight on node until ctx ends.
func (l *chaosLoad) run(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, node string) {
	l.keepPods(ctx, t, c, ns, map[string]int{"": 4}, func(*corev1.Pod) string { return "" }, func(_ string, seq int) *corev1.Pod {
		return devicePod(ns, fmt.Sprintf("w-%d", seq), node, "1", []string{"sh", "-c", "echo devices=$DPKIT_FAKE_DEVICES; sleep 0.5"})
	})
}

// keepPods keeps want[kind] pods of each kind in flight in ns until ctx
// ends: it counts each pod that ended and deletes it, and makes up the
// numbers with newPod(kind, seq); kindOf tells a pod's kind.
func (l *chaosLoad) keepPods(ctx context.Context, t *testing.T, c kubernetes.Interface, ns string, want map[string]int, kindOf func(*corev1.Pod) string, newPod func(kind string, seq int) *corev1.Pod) {
	seq := 0
	counted := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			active := map[string]int{}
			for i := range list.Items {
				p := &list.Items[i]
				switch p.Status.Phase {
				case corev1.PodSucceeded, corev1.PodFailed:
					if !counted[p.Name] {
						counted[p.Name] = true
						l.count(p)
					}
					// A pod that ended is deleted at once, whatever the
					// grace period.
					_ = c.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{})
				default:
					if p.DeletionTimestamp == nil {
						active[kindOf(p)]++
					}
				}
			}
			for kind, n := range want {
				for ; active[kind] < n; active[kind]++ {
					seq++
					if _, err := c.CoreV1().Pods(ns).Create(ctx, newPod(kind, seq), metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
						t.Logf("creating a pod: %v", err)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// count classifies a pod that ended.
func (l *chaosLoad) count(p *corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var why []string
	noDevice := false
	for _, s := range p.Status.ContainerStatuses {
		if t := s.State.Terminated; t != nil {
			why = append(why, fmt.Sprintf("%s (exit %d) %s", t.Reason, t.ExitCode, t.Message))
			noDevice = noDevice || t.ExitCode == chaosNoDevice
		}
	}
	switch {
	case p.Status.Phase == corev1.PodSucceeded:
		l.ok++
	case p.Status.Reason == "UnexpectedAdmissionError" || p.Status.Reason == "TopologyAffinityError":
		l.admission++
		l.failures = append(l.failures, fmt.Sprintf("%s: %s %s", p.Name, p.Status.Reason, p.Status.Message))
	case noDevice:
		l.noDevice++
		l.failures = append(l.failures, fmt.Sprintf("%s: ran without its device %v", p.Name, why))
	default:
		l.other++
		l.failures = append(l.failures, fmt.Sprintf("%s: %s %s %v", p.Name, p.Status.Reason, p.Status.Message, why))
	}
}

// prepareFailed counts pod as one whose claim preparation failed, once.
func (l *chaosLoad) prepareFailed(pod, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.prepareFailedPods == nil {
		l.prepareFailedPods = map[string]bool{}
	}
	if l.prepareFailedPods[pod] {
		return
	}
	l.prepareFailedPods[pod] = true
	l.chaosCounts.prepareFailed++
	l.failures = append(l.failures, fmt.Sprintf("%s: claim preparation failed: %s", pod, message))
}

// watchDevices reads the PodResources of the node (or kubelet) whose root
// is root every 100 ms and counts the snapshots in which a device (of the
// device-plugin front or of a claim, one device through both) is listed
// for two pods.
func (l *chaosLoad) watchDevices(ctx context.Context, root string) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		prc, closer, err := prclient.Dial(ctx, podresources.SocketPath(root))
		if err != nil {
			continue // the node is restarting
		}
		resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		_ = closer.Close()
		if err != nil {
			continue
		}
		owner := map[string]string{}
		var twice []string
		hold := func(pod, device string) {
			if o, ok := owner[device]; ok && o != pod {
				twice = append(twice, device+" ("+o+", "+pod+")")
			}
			owner[device] = pod
		}
		for _, p := range resp.PodResources {
			pod := p.Namespace + "/" + p.Name
			for _, c := range p.Containers {
				// A device has one key whichever front gave it: dpkit's
				// DRA front names a resource's devices so.
				for _, d := range c.Devices {
					for _, id := range d.DeviceIds {
						hold(pod, resourcename.DriverName(d.ResourceName)+"/"+draplugin.DeviceName(id))
					}
				}
				for _, d := range c.DynamicResources {
					for _, r := range d.ClaimResources {
						hold(pod, r.DriverName+"/"+r.DeviceName)
					}
				}
			}
		}
		if len(twice) > 0 {
			sort.Strings(twice)
			l.mu.Lock()
			l.heldTwice++
			l.failures = append(l.failures, "held twice: "+strings.Join(slices.Compact(twice), ","))
			l.mu.Unlock()
		}
	}
}
