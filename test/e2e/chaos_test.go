package e2e

import (
	"context"
	"fmt"
	"os"
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
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
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
	events := 1
	if v := os.Getenv("DPKIT_CHAOS_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DPKIT_CHAOS_EVENTS=%q: want a positive number of events per kind", v)
		}
		events = n
	}
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
				fmt.Fprintf(&report, "| %s | %s | %d | %d | %d | %d | %s |\n", cfg.name, r.kind, r.events, r.admissionFailed, r.otherFailed, r.heldTwice, r.recovery.Round(10*time.Millisecond))
			}
			if cfg.hold > 0 {
				for _, r := range rows {
					if r.admissionFailed > 0 {
						t.Errorf("%s: %d pods failed at admission with the admission hold on", r.kind, r.admissionFailed)
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
	if path := os.Getenv("DPKIT_CHAOS_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report.String()), 0o600); err != nil {
			t.Error(err)
		}
	}
}

// chaosRow is what one event kind cost in one configuration.
type chaosRow struct {
	kind                         string
	events                       int
	admissionFailed, otherFailed int
	heldTwice                    int
	recovery                     time.Duration // the longest until allocatable was whole
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
func (n *chaosNode) allocatableWhole() bool {
	for _, r := range n.node.DeviceManager().Resources() {
		if r.Name == string(foo) {
			return r.Connected && r.Allocatable == 8
		}
	}
	return false
}

// chaosLoad keeps pods asking for one example.com/foo in flight and
// classifies each as it ends.
type chaosLoad struct {
	mu                   sync.Mutex
	admission, other, ok int
	failures             []string
	heldTwice            int
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
	poll(t, ctx, "8 example.com/foo served", func(context.Context) (bool, string, error) { return n.allocatableWhole(), "", nil })
	ns := createNamespace(t, c, "chaos")

	load := &chaosLoad{}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); load.run(lctx, t, c, ns, name) }()
	go func() { defer wg.Done(); load.watchDevices(lctx, root) }()
	defer func() { stopLoad(); wg.Wait() }()

	// completed is how many pods ended so far.
	completed := func() int {
		load.mu.Lock()
		defer load.mu.Unlock()
		return load.admission + load.other + load.ok
	}
	var rows []chaosRow
	for _, kind := range chaosKinds {
		row := chaosRow{kind: kind}
		for range events {
			// Pods in flight around each event: wait for a few to
			// run to their end first.
			before := completed()
			poll(t, ctx, "pods running before the event", func(context.Context) (bool, string, error) {
				return completed() >= before+3, fmt.Sprintf("%d ended", completed()-before), nil
			})
			load.mu.Lock()
			adm, oth, two := load.admission, load.other, load.heldTwice
			load.mu.Unlock()
			start := time.Now()
			n.event(kind)
			poll(t, ctx, "8 example.com/foo served again after a "+kind, func(context.Context) (bool, string, error) { return n.allocatableWhole(), "", nil })
			row.recovery = max(row.recovery, time.Since(start))
			// Let the pods bound around the event meet admission.
			before = completed()
			poll(t, ctx, "pods running after the event", func(context.Context) (bool, string, error) {
				return completed() >= before+3, fmt.Sprintf("%d ended", completed()-before), nil
			})
			load.mu.Lock()
			row.admissionFailed += load.admission - adm
			row.otherFailed += load.other - oth
			row.heldTwice += load.heldTwice - two
			load.mu.Unlock()
			row.events++
		}
		rows = append(rows, row)
	}
	load.mu.Lock()
	if len(load.failures) > 0 {
		t.Logf("pods that failed: %s", strings.Join(load.failures, "; "))
	}
	load.mu.Unlock()
	return rows
}

// run keeps 4 pods in flight on node until ctx ends, deleting each that
// ended once counted.
func (l *chaosLoad) run(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, node string) {
	seq := 0
	counted := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			active := 0
			for i := range list.Items {
				p := &list.Items[i]
				switch p.Status.Phase {
				case corev1.PodSucceeded, corev1.PodFailed:
					if !counted[p.Name] {
						counted[p.Name] = true
						l.count(p)
					}
					_ = c.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
				default:
					if p.DeletionTimestamp == nil {
						active++
					}
				}
			}
			for ; active < 4; active++ {
				seq++
				pod := devicePod(ns, fmt.Sprintf("w-%d", seq), node, "1", []string{"sh", "-c", "echo devices=$DPKIT_FAKE_DEVICES; sleep 0.5"})
				if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
					t.Logf("creating a pod: %v", err)
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

func (l *chaosLoad) count(p *corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case p.Status.Phase == corev1.PodSucceeded:
		l.ok++
	case p.Status.Reason == "UnexpectedAdmissionError" || p.Status.Reason == "TopologyAffinityError":
		l.admission++
		l.failures = append(l.failures, fmt.Sprintf("%s: %s %s", p.Name, p.Status.Reason, p.Status.Message))
	default:
		l.other++
		var why []string
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Terminated != nil {
				why = append(why, s.State.Terminated.Reason)
			}
		}
		l.failures = append(l.failures, fmt.Sprintf("%s: %s %s %v", p.Name, p.Status.Reason, p.Status.Message, why))
	}
}

// watchDevices reads the node's PodResources every 100 ms and counts the
// snapshots in which a device is listed for two pods.
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
		for _, p := range resp.PodResources {
			for _, c := range p.Containers {
				for _, d := range c.Devices {
					for _, id := range d.DeviceIds {
						if o, ok := owner[id]; ok && o != p.Name {
							twice = append(twice, id)
						}
						owner[id] = p.Name
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
