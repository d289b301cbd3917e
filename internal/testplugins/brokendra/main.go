// Command brokendra is a DRA driver for the tests of dpkit verify --dra. It
// speaks the kubelet's gRPC APIs (pluginregistration/v1, dra/v1,
// dra-health/v1) directly and publishes its ResourceSlices with client-go,
// written without pkg/draplugin so that it can misbehave: -mode picks one
// deliberate bug, each aimed at one check, and an empty mode is a driver
// that does everything right. A few modes, marked "(no bug)", are correct
// drivers that do something another way (slices for the node by
// spec.nodeSelector, a generation kept as the upstream ResourceSlice
// controller keeps it), which verify must pass.
//
// It serves driver broken.dpkit.io with devices dev-0 ... dev-3 in a pool
// named after the node, and a second pool of partitions and a shared
// device for the checks of optional features (content.go). It takes its directories, node and API server from
// what verify sets: $DPKIT_REGISTRY_DIR, $DPKIT_DRA_PLUGINS_DIR,
// $DPKIT_CDI_DIR, $NODE_NAME and $KUBECONFIG. Its checkpoint
// (<plugins dir>/broken.dpkit.io/checkpoint.json) lists the claims it
// prepared and survives a restart. With $POD_UID set it supports rolling
// updates: its sockets have the pod's UID in their names, and every
// Prepare and Unprepare reads the checkpoint again under a file lock, so
// that two instances answer for the same claims. It serves health in
// v1 and v1alpha1, for kubelets v1.34 to v1.37.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// modes returns the modes, each a deliberate bug aimed at one check of
// dpkit verify --dra, with their descriptions.
func modes() map[string]string {
	return map[string]string{
		"":                     "no bug",
		"bad-registration":     "lists the version \"1.0.0\" (not a gRPC service name) beside v1.DRAPlugin in GetInfo",
		"register-once":        "answers GetInfo only until it is registered once: a restarted kubelet cannot register it again",
		"slow-reregister":      "answers GetInfo with Unavailable for -delay after it was registered once",
		"stale-socket":         "does not remove a stale socket before listening: started again after a crash, it exits",
		"bad-slices":           "publishes its ResourceSlice without the Node as owner",
		"same-generation":      "publishes two slices; started again, moves a device from the first to the second in place, the second written first, keeping the generation",
		"generation-backwards": "publishes generation 2; started again, writes its slice with generation 1",
		"in-place-update":      "(no bug) started again, changes its devices' attribute in place and keeps the generation, as the upstream ResourceSlice controller does for one slice",
		"node-selector":        "(no bug) publishes with spec.nodeSelector (metadata.name of the node) instead of spec.nodeName, and deletes its slice on SIGTERM",
		"per-device-node":      "(no bug) publishes with spec.perDeviceNodeSelection, each device's nodeName the node, and deletes its slice on SIGTERM",
		"no-republish":         "started again (its checkpoint exists), deletes its ResourceSlice and publishes none",
		"drop-result":          "leaves the last claim out of a NodePrepareResources answer with more than one",
		"fresh-cdi-ids":        "gives a claim prepared again a new CDI device ID",
		"unprepare-unknown":    "answers NodeUnprepareResources of a claim it never prepared with an error",
		"whole-call-error":     "fails the whole NodePrepareResources call when one claim cannot be prepared",
		"no-cdi-spec":          "writes no CDI spec",
		"bad-cdi-spec":         "writes a CDI spec without cdiVersion",
		"no-cdi-rewrite":       "answers Prepare from its checkpoint without writing a CDI spec that is gone",
		"share-device":         "prepares a device held by one claim for another claim without admin access too",
		"refuse-admin":         "refuses a claim whose allocation has adminAccess on a device another claim holds",
		"slow-prepare":         "takes -delay to answer NodePrepareResources",
		"health-once":          "reports health once when the stream opens and never again",
		"ignore-sigterm":       "ignores SIGTERM",
		"slow-exit":            "takes -delay to exit after SIGTERM",
		"leave-sockets":        "exits on SIGTERM without removing its sockets",
		"exit-before-serve":    "exits with status 3 before registering",
		"old-cdi-version":      "writes CDI specs with annotations (a field of CDI 0.6.0) that declare cdiVersion 0.5.0",
		"cdi-device-names":     "names CDI devices after the device, not the claim: two claims of one device define it in two spec files",
		"keep-subrequest":      "answers a device allocated through a subrequest of firstAvailable under request name <request>/<subrequest>",
		"bad-device-status":    "writes networkData.ips without the prefix length in claims' status.devices, which the API server refuses",
		"bad-counters":         "publishes partition part-0b consuming counter set chip-9, which its pool does not define",
		"bad-request-policy":   "publishes shared-0 with a bandwidth requestPolicy default (20Gi) above the capacity (10Gi)",
		"refuse-shares":        "refuses a second claim given a share of shared-0, which allows multiple allocations",
		"no-share-id":          "answers a share of shared-0 without its share_id",
		"health-extra-device":  "reports the health of dev-9, a device it does not publish, beside its devices",

		// What breaks a driver across its life.
		"shared-registration":   "with $POD_UID, serves an endpoint of its own but registers through <driver>-reg.sock, which the first instance of a rolling update removes when it stops",
		"v1-health-only":        "serves and lists health only in v1.DRAResourceHealth, which kubelets v1.34 to v1.36 do not call",
		"forget-after-restart":  "keeps which CDI spec files to remove in memory: after a restart, Unprepare of a claim prepared before leaves its spec",
		"unprepare-reads-claim": "reads the ResourceClaim of a claim it prepared to unprepare it, and fails when it is gone",
		"unprepare-first-only":  "undoes only the first claim of a NodeUnprepareResources call, and reports them all done",
		"busy":                  "answers a NodePrepareResources call that comes while another is in progress with Unavailable \"busy\" (each takes 200ms)",
		"ignore-pool":           "prepares a device by its name, whatever pool the allocation names",
	}
}

const (
	driverName = "broken.dpkit.io"
	cdiKind    = "dpkit.io/brokendra"
)

var devices = []string{"dev-0", "dev-1", "dev-2", "dev-3"}

func main() {
	mode := flag.String("mode", "", "the bug to have; see -list")
	list := flag.Bool("list", false, "list the modes and exit")
	delay := flag.Duration("delay", 3*time.Second, "slow-reregister, slow-prepare, slow-exit: how long")
	healthInterval := flag.Duration("health-interval", 15*time.Second, "how often health is reported")
	healthTimeout := flag.Duration("health-check-timeout", 0, "the health_check_timeout_seconds sent with each device's health (whole seconds; 0: none, the kubelet's default)")
	flag.Parse()
	if *list {
		names := slices.Sorted(maps.Keys(modes()))
		for _, m := range names {
			fmt.Printf("%-20s %s\n", m, modes()[m])
		}
		return
	}
	if _, ok := modes()[*mode]; !ok {
		log.Fatalf("-mode %q: unknown; see -list", *mode)
	}
	d := &driver{
		mode: *mode, delay: *delay, healthInterval: *healthInterval, healthTimeout: *healthTimeout,
		registryDir: os.Getenv("DPKIT_REGISTRY_DIR"), pluginsDir: os.Getenv("DPKIT_DRA_PLUGINS_DIR"),
		cdiDir: os.Getenv("DPKIT_CDI_DIR"), node: os.Getenv("NODE_NAME"), podUID: os.Getenv("POD_UID"),
		mine: map[string]bool{},
	}
	for env, v := range map[string]string{"DPKIT_REGISTRY_DIR": d.registryDir, "DPKIT_DRA_PLUGINS_DIR": d.pluginsDir, "DPKIT_CDI_DIR": d.cdiDir, "NODE_NAME": d.node} {
		if v == "" {
			log.Fatalf("$%s is not set: run brokendra under dpkit verify --dra, which sets it", env)
		}
	}
	if *mode == "exit-before-serve" {
		os.Exit(3)
	}
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if *mode == "ignore-sigterm" {
		signal.Ignore(syscall.SIGTERM)
		sigs = sigs[:1]
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	if err := d.run(ctx); err != nil {
		log.Fatal(err)
	}
}

// prepared is a claim in the checkpoint.
type prepared struct {
	UID     string          `json:"uid"`
	Devices []*drav1.Device `json:"devices"`
	// Admin are the devices the claim has with admin access: it does not
	// hold them.
	Admin []string `json:"admin,omitempty"`
}

type driver struct {
	mode           string
	delay          time.Duration
	healthInterval time.Duration
	healthTimeout  time.Duration
	registryDir    string
	pluginsDir     string
	cdiDir         string
	node           string
	podUID         string
	client         kubernetes.Interface

	// busy: a NodePrepareResources call is in progress (mode busy).
	busy atomic.Bool

	mu         sync.Mutex
	registered bool      // the kubelet said registered once
	refusing   time.Time // slow-reregister: when GetInfo started refusing
	claims     map[string]*prepared
	cdiSerial  int
	// mine are the claims whose CDI spec this process wrote
	// (forget-after-restart removes only those).
	mine map[string]bool

	drav1.UnimplementedDRAPluginServer
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (d *driver) dir() string            { return filepath.Join(d.pluginsDir, driverName) }
func (d *driver) checkpointPath() string { return filepath.Join(d.dir(), "checkpoint.json") }

// endpoint and regSocket are the sockets: with the pod's UID in their
// names in a rolling update, as the kubeletplugin helper names them (the
// registration socket not in shared-registration).
func (d *driver) endpoint() string {
	if d.podUID != "" {
		return filepath.Join(d.dir(), "dra-"+d.podUID+".sock")
	}
	return filepath.Join(d.dir(), "dra.sock")
}

func (d *driver) regSocket() string {
	if d.podUID != "" && d.mode != "shared-registration" {
		return filepath.Join(d.registryDir, driverName+"-"+d.podUID+"-reg.sock")
	}
	return filepath.Join(d.registryDir, driverName+"-reg.sock")
}

// lock takes d.mu and, in a rolling update, the file lock that orders
// the calls of both instances, and reads the checkpoint again: the other
// instance may have prepared or unprepared claims.
func (d *driver) lock() (unlock func(), err error) {
	d.mu.Lock()
	if d.podUID == "" {
		return d.mu.Unlock, nil
	}
	f, err := os.OpenFile(filepath.Join(d.dir(), "checkpoint.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	unlock = func() {
		if f != nil {
			_ = f.Close() // releases the lock
		}
		d.mu.Unlock()
	}
	if err != nil {
		unlock()
		return nil, fmt.Errorf("lock the checkpoint: %w", err)
	}
	data, err := os.ReadFile(d.checkpointPath())
	if err == nil {
		claims := map[string]*prepared{}
		if err = json.Unmarshal(data, &claims); err == nil {
			d.claims = claims
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		unlock()
		return nil, fmt.Errorf("checkpoint %s: %w", d.checkpointPath(), err)
	}
	return unlock, nil
}

func (d *driver) run(ctx context.Context) error {
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("$KUBECONFIG: %w", err)
	}
	// client-go's default, 5 requests a second, would make calls for
	// claims prepared at once wait for each other's reads and status
	// writes.
	rc.QPS, rc.Burst = 50, 100
	if d.client, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	restarted := false
	d.claims = map[string]*prepared{}
	if data, err := os.ReadFile(d.checkpointPath()); err == nil {
		restarted = true
		if err := json.Unmarshal(data, &d.claims); err != nil {
			return fmt.Errorf("checkpoint %s: %w", d.checkpointPath(), err)
		}
	}
	if err := os.MkdirAll(d.dir(), 0o750); err != nil {
		return err
	}
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	err = d.saveLocked()
	unlock()
	if err != nil {
		return err
	}
	if d.mode == "no-republish" && restarted {
		// Before registering, so that verify never sees the old slice.
		err = d.client.ResourceV1().ResourceSlices().Delete(ctx, d.sliceName(0), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the ResourceSlice: %w", err)
		}
	}
	listen := unixsock.Listen
	if d.mode == "stale-socket" {
		listen = func(path string) (net.Listener, error) { return net.Listen("unix", path) }
	}
	draLis, err := listen(d.endpoint())
	if err != nil {
		return fmt.Errorf("listen on %s: %w", d.endpoint(), err)
	}
	draSrv := grpc.NewServer()
	drav1.RegisterDRAPluginServer(draSrv, d)
	drahealthv1.RegisterDRAResourceHealthServer(draSrv, d)
	if d.mode != "v1-health-only" {
		drahealthv1alpha1.RegisterDRAResourceHealthServer(draSrv, drahealthv1.V1ServerWrapper{Server: d})
	}
	go func() { _ = draSrv.Serve(draLis) }()

	regLis, err := listen(d.regSocket())
	if err != nil {
		draSrv.Stop()
		return fmt.Errorf("listen on %s: %w", d.regSocket(), err)
	}
	regSrv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(regSrv, registration{d: d})
	go func() { _ = regSrv.Serve(regLis) }()

	// Published once the servers run: registering does not wait for the
	// API server.
	if d.mode != "no-republish" || !restarted {
		if err := d.publish(ctx, restarted); err != nil {
			log.Printf("Publish the ResourceSlice: %v", err)
		}
	}

	<-ctx.Done()
	if d.mode == "slow-exit" {
		time.Sleep(d.delay)
	}
	if d.mode == "leave-sockets" {
		os.Exit(0) // the listeners' sockets stay
	}
	regSrv.Stop()
	draSrv.Stop()
	_ = os.Remove(d.regSocket())
	_ = os.Remove(d.endpoint())
	d.unpublish()
	return nil
}

func (d *driver) sliceName(i int) string {
	if i == 0 {
		return d.node + "-broken"
	}
	return fmt.Sprintf("%s-broken-%d", d.node, i)
}

// layout is how the devices are split into slices: one slice, but in
// same-generation two, and started again with dev-1 moved from the
// first to the second.
func (d *driver) layout(restarted bool) [][]string {
	switch {
	case d.mode != "same-generation":
		return [][]string{devices}
	case restarted:
		return [][]string{devices[:1], devices[1:]}
	}
	return [][]string{devices[:2], devices[2:]}
}

// writeOrder is the order the slices are written in: same-generation
// writes the slice that gains a device first, so that for a moment the
// device is in both.
func (d *driver) writeOrder(n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if d.mode == "same-generation" {
		slices.Reverse(order)
	}
	return order
}

// publish writes the driver's ResourceSlices: the same devices keep the
// generation, other devices bump it in every slice (the modes aside).
// The devices' attribute dpkit.io/started says whether the driver was
// started again, so that a restart changes the devices and verify sees
// the generation go up.
func (d *driver) publish(ctx context.Context, restarted bool) error {
	node, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	started := "first"
	if restarted {
		started = "again"
	}
	layout := d.layout(restarted)
	client := d.client.ResourceV1().ResourceSlices()
	wants := make([]*resourcev1.ResourceSlice, len(layout))
	olds := make([]*resourcev1.ResourceSlice, len(layout))
	gen, changed := int64(0), false
	for i, names := range layout {
		var devs []resourcev1.Device
		for _, name := range names {
			dev := resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"dpkit.io/started": {StringValue: &started},
			}}
			if d.mode == "per-device-node" {
				dev.NodeName = &d.node
			}
			devs = append(devs, dev)
		}
		want := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: d.sliceName(i)},
			Spec: resourcev1.ResourceSliceSpec{
				Driver:  driverName,
				Pool:    resourcev1.ResourcePool{Name: d.node, ResourceSliceCount: int64(len(layout))},
				Devices: devs,
			},
		}
		switch d.mode {
		case "node-selector":
			want.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{d.node}}},
			}}}
		case "per-device-node":
			want.Spec.PerDeviceNodeSelection = ptr.To(true)
		default:
			want.Spec.NodeName = &d.node
		}
		if d.mode != "bad-slices" {
			want.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		old, err := client.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			changed = true
		case err != nil:
			return err
		default:
			olds[i] = old
			gen = max(gen, old.Spec.Pool.Generation)
			changed = changed || !apiequality.Semantic.DeepEqual(old.Spec.Devices, devs)
		}
		wants[i] = want
	}
	switch {
	case d.mode == "generation-backwards" && restarted:
		gen = 1
	case d.mode == "generation-backwards":
		gen = 2
	case gen == 0:
		gen = 1
	case changed && d.mode != "same-generation" && d.mode != "in-place-update":
		gen++
	}
	for _, i := range d.writeOrder(len(layout)) {
		want := wants[i]
		want.Spec.Pool.Generation = gen
		if olds[i] == nil {
			if _, err := client.Create(ctx, want, metav1.CreateOptions{}); err != nil {
				return err
			}
			continue
		}
		old := olds[i]
		old.Spec, old.OwnerReferences = want.Spec, want.OwnerReferences
		if _, err := client.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return d.publishParts(ctx, node)
}

// unpublish deletes the slices that the kubelet would not: those without
// spec.nodeName.
func (d *driver) unpublish() {
	if d.mode != "node-selector" && d.mode != "per-device-node" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range d.layout(true) {
		if err := d.client.ResourceV1().ResourceSlices().Delete(ctx, d.sliceName(i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			log.Printf("Delete the ResourceSlice: %v", err)
		}
	}
}

// registration is the driver's pluginregistration/v1 server.
type registration struct {
	d *driver
	registerapi.UnimplementedRegistrationServer
}

func (r registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	d := r.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.registered {
		switch d.mode {
		case "register-once":
			return nil, status.Error(codes.FailedPrecondition, "already registered")
		case "slow-reregister":
			if d.refusing.IsZero() {
				d.refusing = time.Now()
			}
			if time.Since(d.refusing) < d.delay {
				return nil, status.Error(codes.Unavailable, "not ready yet")
			}
		}
	}
	versions := []string{drav1.DRAPluginService, drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService}
	if d.mode == "v1-health-only" {
		versions = versions[:2]
	}
	if d.mode == "bad-registration" {
		versions = append(versions, "1.0.0")
	}
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: driverName, Endpoint: d.endpoint(), SupportedVersions: versions}, nil
}

func (r registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		r.d.mu.Lock()
		r.d.registered = true
		r.d.mu.Unlock()
	} else {
		log.Printf("Not registered: %s", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// saveLocked writes the checkpoint.
func (d *driver) saveLocked() error {
	data, err := json.Marshal(d.claims)
	if err != nil {
		return err
	}
	return fileutil.WriteAtomic(d.checkpointPath(), data, 0o600)
}

func (d *driver) NodePrepareResources(ctx context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	if d.mode == "slow-prepare" {
		t := time.NewTimer(d.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if d.mode == "busy" {
		if !d.busy.CompareAndSwap(false, true) {
			return nil, status.Error(codes.Unavailable, "busy: another NodePrepareResources call is in progress")
		}
		defer d.busy.Store(false)
		t := time.NewTimer(200 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	// The claims not prepared yet are read before the lock is taken: the
	// API server is the slow part, and calls for other claims need not
	// wait for it (one the other instance prepared meanwhile is read
	// under the lock).
	d.mu.Lock()
	var unknown []*drav1.Claim
	for _, c := range req.Claims {
		if _, ok := d.claims[c.Uid]; !ok {
			unknown = append(unknown, c)
		}
	}
	d.mu.Unlock()
	fetched := map[string]fetchedClaim{}
	for _, c := range unknown {
		claim, err := d.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		fetched[c.Uid] = fetchedClaim{claim, err}
	}
	unlock, err := d.lock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	resp := &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		devs, err := d.prepare(ctx, c, fetched[c.Uid])
		if err != nil {
			if d.mode == "whole-call-error" {
				return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s: %v", c.Namespace, c.Name, err)
			}
			resp.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
			continue
		}
		resp.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Devices: devs}
	}
	unlock()
	locked = false
	// The status of the claims prepared now is written once the lock is
	// released: the API server is the slow part.
	for _, c := range req.Claims {
		if f := fetched[c.Uid]; f.claim != nil && resp.Claims[c.Uid].GetError() == "" {
			d.writeStatus(ctx, f.claim)
		}
	}
	if d.mode == "drop-result" && len(req.Claims) > 1 {
		delete(resp.Claims, req.Claims[len(req.Claims)-1].Uid)
	}
	return resp, nil
}

// fetchedClaim is a claim of a NodePrepareResources call as the API
// server gave it.
type fetchedClaim struct {
	claim *resourcev1.ResourceClaim
	err   error
}

// prepare prepares one claim, from the checkpoint when it was prepared,
// else from the claim fetched; the lock is held.
func (d *driver) prepare(ctx context.Context, c *drav1.Claim, fetched fetchedClaim) ([]*drav1.Device, error) {
	p, ok := d.claims[c.Uid]
	if ok {
		switch d.mode {
		case "fresh-cdi-ids":
			d.cdiSerial++
			for _, dev := range p.Devices {
				dev.CdiDeviceIds = []string{fmt.Sprintf("%s=%s-%s-%d", cdiKind, c.Uid, dev.DeviceName, d.cdiSerial)}
			}
			if err := d.saveLocked(); err != nil {
				return nil, err
			}
		case "no-cdi-rewrite":
			return p.Devices, nil
		}
		return p.Devices, d.writeSpec(p)
	}
	claim, err := fetched.claim, fetched.err
	if claim == nil && err == nil {
		claim, err = d.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("read the claim: %w", err)
	}
	if string(claim.UID) != c.Uid {
		return nil, fmt.Errorf("claim %s/%s has UID %s, not %s", c.Namespace, c.Name, claim.UID, c.Uid)
	}
	if claim.Status.Allocation == nil {
		return nil, errors.New("the claim is not allocated")
	}
	p = &prepared{UID: c.Uid}
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver != driverName {
			continue
		}
		if !d.known(res.Pool, res.Device) && (d.mode != "ignore-pool" || !slices.Contains(devices, res.Device)) {
			return nil, fmt.Errorf("device %s/%s: not one of this driver's devices", res.Pool, res.Device)
		}
		// A result with admin access neither holds its device nor is
		// refused one another claim holds.
		admin := res.AdminAccess != nil && *res.AdminAccess
		if !d.sharable(res) && ((!admin && d.mode != "share-device") || (admin && d.mode == "refuse-admin")) {
			for uid, other := range d.claims {
				if slices.ContainsFunc(other.Devices, func(x *drav1.Device) bool {
					return x.DeviceName == res.Device && !slices.Contains(other.Admin, x.DeviceName)
				}) {
					return nil, fmt.Errorf("device %s is prepared for claim %s", res.Device, uid)
				}
			}
		}
		if admin {
			p.Admin = append(p.Admin, res.Device)
		}
		p.Devices = append(p.Devices, d.answer(c.Uid, res))
	}
	if err := d.writeSpec(p); err != nil {
		return nil, err
	}
	d.claims[c.Uid] = p
	return p.Devices, d.saveLocked()
}

func (d *driver) specPath(uid string) string {
	return filepath.Join(d.cdiDir, "brokendra-"+uid+".json")
}

// writeSpec writes the CDI spec of a claim's devices.
func (d *driver) writeSpec(p *prepared) error {
	if d.mode == "no-cdi-spec" {
		return nil
	}
	type device struct {
		Name           string            `json:"name"`
		Annotations    map[string]string `json:"annotations,omitempty"`
		ContainerEdits map[string]any    `json:"containerEdits"`
	}
	spec := struct {
		Version string   `json:"cdiVersion,omitempty"`
		Kind    string   `json:"kind"`
		Devices []device `json:"devices"`
	}{Version: d.cdiVersion(), Kind: cdiKind}
	for _, dev := range p.Devices {
		for _, id := range dev.CdiDeviceIds {
			spec.Devices = append(spec.Devices, device{Name: strings.TrimPrefix(id, cdiKind+"="), Annotations: cdiAnnotations(p.UID),
				ContainerEdits: map[string]any{"env": []string{"BROKENDRA_DEVICE=" + dev.DeviceName}}})
		}
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	d.mine[p.UID] = true
	return fileutil.WriteAtomic(d.specPath(p.UID), data, 0o644)
}

func (d *driver) NodeUnprepareResources(ctx context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	unlock, err := d.lock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	defer unlock()
	resp := &drav1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1.NodeUnprepareResourceResponse{}}
	for i, c := range req.Claims {
		resp.Claims[c.Uid] = &drav1.NodeUnprepareResourceResponse{}
		_, known := d.claims[c.Uid]
		switch {
		case d.mode == "unprepare-first-only" && i > 0:
			continue
		case !known && d.mode == "unprepare-unknown":
			resp.Claims[c.Uid].Error = "claim " + c.Uid + " is not prepared"
			continue
		case known && d.mode == "unprepare-reads-claim":
			if _, err := d.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
				resp.Claims[c.Uid].Error = "read the claim: " + err.Error()
				continue
			}
		}
		delete(d.claims, c.Uid)
		if d.mode != "forget-after-restart" || d.mine[c.Uid] {
			_ = os.Remove(d.specPath(c.Uid))
		}
		delete(d.mine, c.Uid)
	}
	return resp, d.saveLocked()
}

func (d *driver) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	tick := time.NewTicker(d.healthInterval)
	defer tick.Stop()
	for {
		msg := &drahealthv1.NodeWatchResourcesResponse{}
		names := append(slices.Clone(devices), d.healthExtra()...)
		sort.Strings(names)
		for _, name := range names {
			msg.Devices = append(msg.Devices, &drahealthv1.DeviceHealth{
				Device: &drahealthv1.DeviceIdentifier{PoolName: d.node, DeviceName: name},
				Health: drahealthv1.HealthStatus_HEALTHY, LastUpdatedTime: time.Now().Unix(),
				HealthCheckTimeoutSeconds: int64(d.healthTimeout / time.Second),
			})
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		if d.mode == "health-once" {
			<-stream.Context().Done()
			return nil
		}
		select {
		case <-tick.C:
		case <-stream.Context().Done():
			return nil
		}
	}
}
