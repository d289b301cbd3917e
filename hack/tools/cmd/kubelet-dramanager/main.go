// Command kubelet-dramanager runs the kubelet's own DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra, Kubernetes v1.37.0) on its own, so
// dpkit's tests can run the same scenarios against it and against
// pkg/dramanager and compare what drivers, checkpoints and pod statuses see
// (test/e2e/dra_sidebyside_test.go).
//
// The upstream Manager is built as the kubelet builds it (NewManager with a
// client of the API server it reads ResourceClaims from, its checkpoint in
// --root) and started with Start. The upstream plugin manager (plugin
// watcher and reconciler) watches <root>/plugins_registry and hands
// DRAPlugin registrations to the Manager's handler, as the kubelet does.
//
// Protocol: one JSON object per line on stdout; commands one per line on
// stdin. Logs (klog) go to stderr.
//
//	{"event":"ready","root":...}
//	{"event":"update","pods":[UID...]}    what the Manager sent on Updates()
//
//	wait-registered DRIVER -> {"event":"registered","driver":..}
//	                          once GetPlugin(DRIVER) succeeds (polled
//	                          every 10ms: the kubelet has no registration
//	                          event), or {"event":"error","error":..} after
//	                          a minute
//	prepare POD-JSON       -> {"event":"prepare","pod":UID,"error":".."}
//	                          PrepareResources; the pod is active from now
//	unprepare POD-JSON     -> {"event":"unprepare","pod":UID,"error":".."}
//	                          UnprepareResources; the pod is no longer active
//	reconcile [UID,...]    -> {"event":"reconciled"}
//	                          the pods listed are the active ones; then one
//	                          pass of the Manager's reconcile loop
//	status POD-JSON        -> {"event":"status","pod":UID,"containers":
//	                          [{"name":..,"allocatedResourcesStatus":[..]}]}
//	                          UpdateAllocatedResourcesStatus on a status
//	                          with one empty ContainerStatus per container
//
// POD-JSON is a core/v1 Pod on one line. "error" is empty on success.
//
// The reconcile loop is private (reconcileLoop, run by Start every 60s,
// only once the kubelet's config sources are ready). Here the sources are
// ready only while a reconcile command runs, so the loop never runs on its
// own, and the command calls that same method through a linkname
// directive; nothing else of the Manager is bypassed.
//
// SIGINT or SIGTERM stops the manager; so does closing stdin.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	_ "unsafe" // go:linkname

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

//go:linkname reconcileLoop k8s.io/kubernetes/pkg/kubelet/cm/dra.(*Manager).reconcileLoop
func reconcileLoop(m *dra.Manager, ctx context.Context)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dramanager:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.CommandLine
	root := fs.String("root", "", "the kubelet's root directory: dra_manager_state and dra_health_state there, drivers register in <root>/plugins_registry (required)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server the ResourceClaims are read from (required)")
	nodeName := fs.String("node-name", "kubelet-dramanager", "the node's name (the Manager wipes this node's ResourceSlices at start)")
	showVersion := fs.Bool("version", false, "print the Kubernetes version and exit")
	klog.InitFlags(fs)
	flag.Parse()
	if *showVersion {
		fmt.Println("Kubernetes " + version.Get().GitVersion)
		return nil
	}
	switch {
	case flag.NArg() != 0:
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	case *root == "":
		return errors.New("--root is required: the directory of the checkpoint and of plugins_registry")
	case *kubeconfig == "":
		return errors.New("--kubeconfig is required: the API server the ResourceClaims are read from")
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		return err
	}
	registry := filepath.Join(abs, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	m, err := dra.NewManager(logger, client, abs)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	h := &host{m: m, out: &printer{enc: json.NewEncoder(os.Stdout)}, active: map[string]*corev1.Pod{}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: *nodeName}}
	getNode := func(context.Context) (*corev1.Node, error) { return node, nil }
	if err := m.Start(ctx, h.activePods, getNode, &h.ready); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	defer m.Stop()

	pm := pluginmanager.NewPluginManager(registry, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, m.GetWatcherHandler())
	stopCh := make(chan struct{})
	defer close(stopCh)
	go pm.Run(ctx, &sourcesReady{always: true}, stopCh)

	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-m.Updates():
				h.out.print(map[string]any{"event": "update", "pods": u.PodUIDs})
			}
		}
	}()

	h.out.print(map[string]any{"event": "ready", "root": abs})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			h.command(ctx, line)
		}
	}
}

// sourcesReady is the kubelet's config.SourcesReady: whether every pod
// source was seen.
type sourcesReady struct {
	always bool
	now    atomic.Bool
}

func (s *sourcesReady) AddSource(string) {}
func (s *sourcesReady) AllReady() bool   { return s.always || s.now.Load() }

type host struct {
	m     *dra.Manager
	out   *printer
	ready sourcesReady // the reconcile loop's: ready only during "reconcile"

	mu     sync.Mutex
	active map[string]*corev1.Pod
}

func (h *host) activePods() []*corev1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(h.active))
	for _, p := range h.active {
		pods = append(pods, p)
	}
	return pods
}

func (h *host) command(ctx context.Context, line string) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch verb {
	case "wait-registered":
		h.waitRegistered(ctx, arg)
	case "prepare", "unprepare", "status":
		var pod corev1.Pod
		if err := json.Unmarshal([]byte(arg), &pod); err != nil {
			h.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("%s: POD-JSON: %v", verb, err)})
			return
		}
		h.podCommand(ctx, verb, &pod)
	case "reconcile":
		h.mu.Lock()
		keep := map[string]*corev1.Pod{}
		for _, uid := range strings.Split(arg, ",") {
			if p, ok := h.active[uid]; ok {
				keep[uid] = p
			}
		}
		h.active = keep
		h.mu.Unlock()
		h.ready.now.Store(true)
		reconcileLoop(h.m, ctx)
		h.ready.now.Store(false)
		h.out.print(map[string]any{"event": "reconciled"})
	default:
		h.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("unknown command %q (wait-registered, prepare, unprepare, reconcile, status)", verb)})
	}
}

func (h *host) podCommand(ctx context.Context, verb string, pod *corev1.Pod) {
	ev := map[string]any{"event": verb, "pod": string(pod.UID)}
	var err error
	switch verb {
	case "prepare":
		h.mu.Lock()
		h.active[string(pod.UID)] = pod
		h.mu.Unlock()
		err = h.m.PrepareResources(ctx, pod)
	case "unprepare":
		h.mu.Lock()
		delete(h.active, string(pod.UID))
		h.mu.Unlock()
		err = h.m.UnprepareResources(ctx, pod)
	case "status":
		status := &corev1.PodStatus{}
		for _, c := range pod.Spec.Containers {
			status.ContainerStatuses = append(status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name})
		}
		h.m.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), pod, status)
		var cs []map[string]any
		for _, s := range status.ContainerStatuses {
			cs = append(cs, map[string]any{"name": s.Name, "allocatedResourcesStatus": s.AllocatedResourcesStatus})
		}
		ev["containers"] = cs
	}
	ev["error"] = ""
	if err != nil {
		ev["error"] = err.Error()
	}
	h.out.print(ev)
}

// waitRegistered polls GetPlugin: the kubelet's DRA plugin manager tells
// no one when a driver registered.
func (h *host) waitRegistered(ctx context.Context, driver string) {
	pm, ok := h.m.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		h.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("watcher handler is %T", h.m.GetWatcherHandler())})
		return
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := pm.GetPlugin(driver)
		if err == nil {
			h.out.print(map[string]any{"event": "registered", "driver": driver})
			return
		}
		if time.Now().After(deadline) {
			h.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("wait-registered %s: %v", driver, err)})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// printer writes one JSON object per line.
type printer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (p *printer) print(v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dramanager: write stdout:", err)
	}
}
