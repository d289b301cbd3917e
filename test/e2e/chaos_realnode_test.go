package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/test/controlplane"
)

// The lifecycle chaos run on the real node (docs/reliability.md): kubelet
// v1.37 with containerd, dpkit's generic plugin deployed from the full
// image as users do, one resource on the device-plugin front and one on
// the DRA front. While pods asking for one device of each are created
// and deleted continuously, the node goes through each event kind in
// turn; "none" is a quiet window measured alike, what the pods cost with
// no event at all.
//
// DPKIT_CHAOS_EVENTS is the number of events of each kind: 1 (the short
// mode the suite runs) unless set; make chaos sets more.

// realChaosKinds are the event kinds on the real node, run in turn.
var realChaosKinds = []string{
	"none",
	"kubelet SIGTERM restart",
	"kubelet SIGKILL restart",
	"reboot",
	"rolling update, maxSurge 1",
	"rolling update, maxUnavailable 1",
	"plugin crash loop",
	"front switch",
}

// realChaosDevices is the number of devices of each resource.
const realChaosDevices = 4

func TestChaosRealNode(t *testing.T) {
	cp, n := realNode.Get(t)
	importFullImage(t, n) // before the deadline starts: a cold build takes minutes
	pollImg.importInto(t, n)
	events := chaosEvents(t)
	var report strings.Builder
	fmt.Fprintf(&report, "| plugin | event | events | pods ended | failed at admission | claim preparation failed (retried) | ran without its device | other pod failures | devices held twice | whole again (max) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, cfg := range []struct {
		name   string
		deploy func(*testing.T, context.Context, *controlplane.ControlPlane, *controlplane.Node) *realChaosNode
	}{
		{"dpkit (both fronts)", deployDpkitChaos},
		{"polling every 10 s (device plugin)", deployPollChaos},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(events*len(realChaosKinds))*3*time.Minute+5*time.Minute)
			defer cancel()
			rn := cfg.deploy(t, ctx, cp, n)
			rows := runRealChaos(t, ctx, rn, events)
			for _, r := range rows {
				fmt.Fprintf(&report, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %s |\n", cfg.name, r.kind, r.events, r.ended(), r.admission, r.prepareFailed, r.noDevice, r.other, r.heldTwice, r.recovery.Round(10*time.Millisecond))
				if r.heldTwice > 0 {
					t.Errorf("%s: a device was listed for two pods in %d PodResources snapshots", r.kind, r.heldTwice)
				}
				if r.noDevice > 0 {
					t.Errorf("%s: %d pods ran without the device they asked for", r.kind, r.noDevice)
				}
			}
		})
	}
	t.Logf("lifecycle chaos on the real node (kubelet %s), %d event(s) of each kind:\n%s", controlplane.KubeletVersion(), events, report.String())
	writeChaosReport(t, "-realnode", report.String())
}

// deployDpkitChaos deploys dpkit's generic plugin from the full image
// with one resource on each front, and the DeviceClass and the claim
// template for the DRA one.
func deployDpkitChaos(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, n *controlplane.Node) *realChaosNode {
	c := cp.Client()
	res, draRes := "e2e.dpkit.io/zero-chaos", "e2e.dpkit.io/zero-chaos-dra"
	entry := func(name, fronts string) string {
		return "- generic:\n" + indent(strings.Replace(zeroConfig(name), "count: 2", fmt.Sprintf("count: %d", realChaosDevices), 1), "    ") + "  fronts: [" + fronts + "]\n"
	}
	// config is the plugin's configuration with res on front.
	config := func(front string) string {
		return "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\ndra:\n  kubeconfig: /etc/dpkit-kube/kubeconfig\nplugins:\n" +
			entry(res, front) + entry(draRes, "dra")
	}
	d, dir := deployFullImage(t, ctx, cp, n, config("deviceplugin"), res)
	d.waitPluginReady(t, ctx, c, n.Name, fmt.Sprint(realChaosDevices))
	// A DeviceClass for each resource, with its extended resource name:
	// the scheduler serves res through DRA once the node's allocatable
	// of it is 0 (a front switch).
	applyDeviceClasses(t, ctx, c, "--config", filepath.Join(dir, "plugin.yaml"), "--all")
	class := ""
	classes, err := c.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dc := range classes.Items {
		if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == draRes {
			class = dc.Name
		}
	}
	if class == "" {
		t.Fatalf("no DeviceClass for %s", draRes)
	}
	configMap := ""
	for _, o := range d.objs {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "dpkit-plugin-config") {
			configMap = o.GetName()
		}
	}
	ns := createNamespace(t, c, "chaos-real")
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dev"},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: claimFor(ns, "", class, 1).Spec},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &realChaosNode{t: t, ctx: ctx, c: c, n: n, d: d, ns: ns, res: corev1.ResourceName(res), driver: resourcename.DriverName(draRes), tmpl: tmpl.Name, port: 9410,
		config: config, configMap: configMap, resFront: "deviceplugin"}
}

// runRealChaos runs the events on the node rn deployed, with two pods of
// each of its fronts in flight.
func runRealChaos(t *testing.T, ctx context.Context, rn *realChaosNode, events int) []chaosRow {
	poll(t, ctx, "the node whole", rn.whole)
	load := &chaosLoad{}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); rn.runLoad(lctx, load) }()
	go func() { defer wg.Done(); load.watchDevices(lctx, rn.n.KubeletRoot) }()
	go func() { defer wg.Done(); watchPrepareFailures(lctx, rn.c, load, rn.ns) }()
	defer func() {
		stopLoad()
		wg.Wait()
		deleteAllPods(t, rn.c, rn.ns)
	}()
	kinds := realChaosKinds
	if rn.config == nil { // one front: nothing to switch
		kinds = slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return k == "front switch" })
	}
	return chaosRounds(t, ctx, load, kinds, events, rn.event, rn.whole)
}

// realChaosNode is the real node and the plugin's DaemonSet the events
// act on.
type realChaosNode struct {
	t   *testing.T
	ctx context.Context
	c   kubernetes.Interface
	n   *controlplane.Node
	d   deployment
	ns  string // the pods'
	res corev1.ResourceName
	// driver and tmpl are the DRA front's driver and the claim template
	// of the pods asking through it; empty without a DRA front.
	driver, tmpl string
	// port is the plugin's metrics port (host network): each rolling
	// update moves it, so the surge pod can bind beside the old one.
	port int32
	// config is the plugin's configuration with res on a front, the
	// ConfigMap holding it, and res's front now ("deviceplugin" or
	// "dra"); no config: no front switch.
	config    func(front string) string
	configMap string
	resFront  string
}

// event runs one event of kind; whole is awaited after it.
func (r *realChaosNode) event(kind string) {
	t, ctx := r.t, r.ctx
	var err error
	switch kind {
	case "none":
	case "kubelet SIGTERM restart":
		err = r.n.RestartKubelet(ctx, syscall.SIGTERM)
	case "kubelet SIGKILL restart":
		err = r.n.RestartKubelet(ctx, syscall.SIGKILL)
	case "reboot":
		err = r.n.Reboot(ctx)
	case "rolling update, maxSurge 1":
		err = r.roll(intstr.FromInt32(1), intstr.FromInt32(0))
	case "rolling update, maxUnavailable 1":
		err = r.roll(intstr.FromInt32(0), intstr.FromInt32(1))
	case "plugin crash loop":
		err = r.crashLoop(2)
	case "front switch":
		err = r.switchFront()
	default:
		err = fmt.Errorf("no event kind %q", kind)
	}
	if err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
}

// roll rolls the plugin's DaemonSet to a new template (the next metrics
// port) with the rolling update's maxSurge and maxUnavailable, and waits
// until the old pod is gone and the new one ready.
func (r *realChaosNode) roll(surge, unavailable intstr.IntOrString) error {
	old, err := r.pluginPod(r.ctx)
	if err != nil {
		return err
	}
	ds, err := r.c.AppsV1().DaemonSets(r.d.namespace).Get(r.ctx, r.d.daemonSet, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{
		Type:          appsv1.RollingUpdateDaemonSetStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxSurge: &surge, MaxUnavailable: &unavailable},
	}
	r.port++
	setMetricsPort(ds, r.port)
	if ds.Spec.Template.Annotations == nil {
		ds.Spec.Template.Annotations = map[string]string{}
	}
	ds.Spec.Template.Annotations["e2e.dpkit.io/rollout"] = fmt.Sprint(r.port)
	if _, err := r.c.AppsV1().DaemonSets(r.d.namespace).Update(r.ctx, ds, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return waitRolledOut(r.ctx, r.c, r.d, old.Name)
}

// switchFront moves res to the other front and rolls the plugin to it
// (maxSurge 1, the manifests' strategy): the same pods, asking res as an
// extended resource, are then served through DRA (the DeviceClass's
// extendedResourceName, once the node's allocatable of res is 0), or
// through the device plugin again.
func (r *realChaosNode) switchFront() error {
	next := "dra"
	if r.resFront == "dra" {
		next = "deviceplugin"
	}
	cm, err := r.c.CoreV1().ConfigMaps(r.d.namespace).Get(r.ctx, r.configMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cm.Data["config.yaml"] = r.config(next)
	if _, err := r.c.CoreV1().ConfigMaps(r.d.namespace).Update(r.ctx, cm, metav1.UpdateOptions{}); err != nil {
		return err
	}
	r.resFront = next
	return r.roll(intstr.FromInt32(1), intstr.FromInt32(0))
}

// crashLoop kills the plugin's container (SIGKILL, through containerd)
// times times, each time as soon as the kubelet has started it again:
// the kubelet's back-off grows between the restarts, as for a plugin
// that crashes as it starts.
func (r *realChaosNode) crashLoop(times int) error {
	for range times {
		p, err := r.pluginPod(r.ctx)
		if err != nil {
			return err
		}
		st := p.Status.ContainerStatuses[0]
		if _, err := r.n.Ctr(r.ctx, "tasks", "kill", "--signal", "SIGKILL", strings.TrimPrefix(st.ContainerID, "containerd://")); err != nil {
			return err
		}
		poll(r.t, r.ctx, "the plugin's container started again", func(ctx context.Context) (bool, string, error) {
			q, err := r.c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			s := q.Status.ContainerStatuses[0]
			return s.RestartCount > st.RestartCount && s.State.Running != nil, fmt.Sprintf("restarts %d, state %+v", s.RestartCount, s.State), nil
		})
	}
	return nil
}

// pluginPod returns the DaemonSet's one pod that is ready and not going
// away.
func (r *realChaosNode) pluginPod(ctx context.Context) (*corev1.Pod, error) {
	var pod *corev1.Pod
	var err error
	poll(r.t, ctx, "the plugin's pod ready", func(ctx context.Context) (bool, string, error) {
		pod, err = r.readyPluginPod(ctx)
		return pod != nil, fmt.Sprint(err), nil
	})
	return pod, err
}

func (r *realChaosNode) readyPluginPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := r.c.CoreV1().Pods(r.d.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var ready []*corev1.Pod
	var states []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if !strings.HasPrefix(p.Name, r.d.daemonSet+"-") {
			continue
		}
		states = append(states, fmt.Sprintf("%s %s deleting=%v ready=%v", p.Name, p.Status.Phase, p.DeletionTimestamp != nil, podReady(p)))
		if p.DeletionTimestamp == nil && podReady(p) {
			ready = append(ready, p)
		}
	}
	if len(ready) != 1 || len(states) != 1 {
		return nil, fmt.Errorf("plugin pods: %v", states)
	}
	return ready[0], nil
}

// whole reports whether the node serves every device again on each
// front: the kubelet lists them all as allocatable (its PodResources),
// the Node's allocatable says so, the DaemonSet's one pod is ready (dpkit's
// is ready once registered with the kubelet on both fronts) and the DRA
// front's ResourceSlice lists them all.
func (r *realChaosNode) whole(ctx context.Context) (bool, string, error) {
	// res through the device plugin front: all its devices. Through
	// the DRA front: none on the Node (the kubelet's own list keeps the
	// gone plugin's devices for its grace period, 5 min).
	want := realChaosDevices
	if r.resFront == "dra" {
		want = 0
	} else if got := allocatableAt(ctx, r.n, r.res); got != want {
		return false, fmt.Sprintf("the kubelet's allocatable %s: %d", r.res, got), nil
	}
	node, err := r.c.CoreV1().Nodes().Get(ctx, r.n.Name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error(), nil
	}
	if q := node.Status.Allocatable[r.res]; q.Value() != int64(want) {
		return false, "the Node's allocatable " + q.String(), nil
	}
	if _, err := r.readyPluginPod(ctx); err != nil {
		return false, err.Error(), nil
	}
	drivers := []string{r.driver}
	if r.resFront == "dra" {
		drivers = append(drivers, resourcename.DriverName(string(r.res)))
	}
	for _, driver := range drivers {
		if driver == "" {
			continue
		}
		names, err := sliceDevices(ctx, r.c, r.n.Name, driver)
		if err != nil || len(names) != realChaosDevices {
			return false, fmt.Sprintf("%s's ResourceSlice devices %v (%v)", driver, names, err), nil
		}
	}
	return true, "", nil
}

// setMetricsPort moves the plugin's metrics port (its probes' port and
// --metrics-address) to port.
func setMetricsPort(ds *appsv1.DaemonSet, port int32) {
	ctr := &ds.Spec.Template.Spec.Containers[0]
	for i, a := range ctr.Args {
		if strings.HasPrefix(a, "--metrics-address=") {
			ctr.Args[i] = fmt.Sprintf("--metrics-address=:%d", port)
		}
	}
	for i := range ctr.Ports {
		if ctr.Ports[i].Name == "metrics" {
			ctr.Ports[i].ContainerPort = port
		}
	}
}

// realChaosPod is a pod for the real node asking for one device, through
// the device-plugin front (res) or through a claim from the template
// tmpl; it checks the device is there (or exits chaosNoDevice) and ends
// a second later.
func realChaosPod(ns, name, node string, res corev1.ResourceName, tmpl string) *corev1.Pod {
	p := zeroPod(ns, name, res, "1")
	p.Spec.RestartPolicy = corev1.RestartPolicyNever
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	p.Spec.Containers[0].Command = []string{"sh", "-c", fmt.Sprintf(`test "$DPKIT_E2E" = "from the plugin" && head -c 1 /dev/dpkit-zero >/dev/null || exit %d; sleep 1`, chaosNoDevice)}
	if tmpl != "" {
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: &tmpl}}
	}
	return p
}

// runLoad keeps two pods of each front in flight on the node until ctx
// ends; a pod's kind is the claim template it asks through ("" for the
// device plugin front).
func (r *realChaosNode) runLoad(ctx context.Context, load *chaosLoad) {
	want := map[string]int{"": 2}
	if r.tmpl != "" {
		want[r.tmpl] = 2
	}
	kindOf := func(p *corev1.Pod) string {
		if len(p.Spec.ResourceClaims) > 0 {
			return *p.Spec.ResourceClaims[0].ResourceClaimTemplateName
		}
		return ""
	}
	load.keepPods(ctx, r.t, r.c, r.ns, want, kindOf, func(tmpl string, seq int) *corev1.Pod {
		name := fmt.Sprintf("dp-%d", seq)
		if tmpl != "" {
			name = fmt.Sprintf("dra-%d", seq)
		}
		return realChaosPod(r.ns, name, r.n.Name, r.res, tmpl)
	})
}

// watchPrepareFailures counts the pods of ns whose claims the kubelet
// failed to prepare (its FailedPrepareDynamicResources events).
func watchPrepareFailures(ctx context.Context, c kubernetes.Interface, load *chaosLoad, ns string) {
	sel := fields.OneTermEqualSelector("reason", "FailedPrepareDynamicResources").String()
	for ctx.Err() == nil {
		w, err := c.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			select { // the API server is away: try again in a second
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ev := range w.ResultChan() {
			if e, ok := ev.Object.(*corev1.Event); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				load.prepareFailed(e.InvolvedObject.Name, e.Message)
			}
		}
		w.Stop()
	}
}

// deleteAllPods deletes the pods of ns and waits until the node removed
// them.
func deleteAllPods(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	for _, p := range list.Items {
		deletePodAndWait(t, c, ns, p.Name)
	}
}

// pollPluginImage is the image of test/pollplugin, the chaos run's
// baseline.
const pollPluginImage = "dpkit.test/pollplugin:e2e"

// pollImg is test/pollplugin and its image.
var pollImg = &testImage{
	pkg: "./test/pollplugin",
	image: func(bin string) ociimage.Image {
		return ociimage.Image{
			Name: pollPluginImage, OS: "linux", Architecture: goruntime.GOARCH,
			Config: ociimage.Config{User: "0:0", Entrypoint: []string{"/pollplugin"}},
			Files:  []ociimage.File{{Path: "/pollplugin", Mode: 0o755, Source: bin}},
		}
	},
}

// deployPollChaos deploys the baseline plugin (test/pollplugin) as a
// DaemonSet on the node: the device plugin front only.
func deployPollChaos(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, n *controlplane.Node) *realChaosNode {
	c := cp.Client()
	res := "e2e.dpkit.io/zero-chaos-poll"
	ns := createNamespace(t, c, "chaos-poll")
	labels := map[string]string{"app": "pollplugin"}
	dir := corev1.HostPathDirectory
	ds := &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "pollplugin", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{corev1.LabelHostname: n.Name},
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					TerminationGracePeriodSeconds: ptr(int64(5)),
					Containers: []corev1.Container{{
						Name: "plugin", Image: pollPluginImage, ImagePullPolicy: corev1.PullNever,
						Env: []corev1.EnvVar{
							{Name: "RESOURCE_NAME", Value: res},
							{Name: "COUNT", Value: fmt.Sprint(realChaosDevices)},
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "device-plugins", MountPath: "/var/lib/kubelet/device-plugins"}},
					}},
					Volumes: []corev1.Volume{{Name: "device-plugins", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/device-plugins", Type: &dir}}}},
				},
			},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ds)
	if err != nil {
		t.Fatal(err)
	}
	d := deployment{objs: []*unstructured.Unstructured{{Object: obj}}, namespace: ns, daemonSet: ds.Name, resource: corev1.ResourceName(res)}
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, fmt.Sprint(realChaosDevices))
	return &realChaosNode{t: t, ctx: ctx, c: c, n: n, d: d, ns: ns, res: d.resource}
}
