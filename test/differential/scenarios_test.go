package differential

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

const (
	resA = "example.com/a"
	resB = "example.com/b"
)

var fourA = healthy("a0", "a1", "a2", "a3")

// sdkDef returns an SDK plugin serving devs of res through kubelet.sock
// with GetPreferredAllocation (which makes both managers' device choice
// deterministic: without it the kubelet picks from a Go map).
func sdkDef(name, res string, devs []dev) pluginDef {
	return pluginDef{name: name, resource: res, devices: devs, via: viaKubelet, sdk: true}
}

func rawDef(name, res string, devs []dev) pluginDef {
	return pluginDef{name: name, resource: res, devices: devs, via: viaKubelet}
}

func (d pluginDef) viaRegistry() pluginDef { d.via = viaRegistry; return d }
func (d pluginDef) withPreStart() pluginDef {
	d.preStart = true
	return d
}
func (d pluginDef) withoutPreferred() pluginDef {
	d.noPreferred = true
	return d
}
func (d pluginDef) withInstance(id string) pluginDef {
	d.instance = id
	return d
}

func unhealthyDev(id string) dev { return dev{id: id, health: pluginapi.Unhealthy} }
func healthyDev(id string) dev   { return dev{id: id, health: pluginapi.Healthy} }

// numa returns the flags of a two-NUMA-node machine with a topology
// policy and scope.
func numa(policy, scope string) []string {
	return []string{"--numa-nodes", "0,1", "--topology-policy", policy, "--topology-scope", scope}
}

// onNUMA returns healthy devices attached to NUMA nodes, in ID order.
func onNUMA(perNode map[int64][]string) []dev {
	var out []dev
	for _, n := range slices.Sorted(maps.Keys(perNode)) {
		for _, id := range perNode[n] {
			out = append(out, dev{id: id, health: pluginapi.Healthy, numa: []int64{n}})
		}
	}
	slices.SortFunc(out, func(a, b dev) int { return strings.Compare(a.id, b.id) })
	return out
}

// forget drops a pod from what the restarted manager will know, as when
// a pod is deleted while the kubelet is down.
func forget(name string) step {
	return step{what: "pod " + name + " is deleted while the device manager is down", do: func(s *side) ([]string, error) {
		s.live = slices.DeleteFunc(s.live, func(p podSpec) bool { return p.Name == name })
		return nil, nil
	}}
}

// stopManagerOnly stops the manager without starting it again; a later
// kubeletStarts starts it.
func stopManagerOnly(sig syscall.Signal) step {
	return step{what: "the device manager stops (" + sigName(sig) + "); checkpoint", do: func(s *side) ([]string, error) {
		lines := s.awaitWrites()
		if err := s.stopManager(sig); err != nil {
			return nil, err
		}
		return append(lines, s.checkpointLines()...), nil
	}}
}

// corruptCheckpoint overwrites the checkpoint while the manager is down.
func corruptCheckpoint() step {
	return step{what: "the checkpoint is corrupted while the device manager is down", do: func(s *side) ([]string, error) {
		return nil, os.WriteFile(filepath.Join(s.pluginDir, checkpoint.FileName), []byte(`{"Data":{"PodDeviceEntries":[`), 0o600)
	}}
}

// scenarios is the differential suite. Names are short: they become
// temporary directory names, and socket paths must stay below 108 bytes.
func scenarios() []scenario {
	a2 := pod("p1", ctr("main", resA, 2))
	return []scenario{
		// Registration.
		{name: "reg-kubelet-sock", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			start("p1", "main"),
		}},
		{name: "reg-plugins-registry", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).viaRegistry()),
			expect(resA + "=4/4"),
			admit(a2),
			start("p1", "main"),
		}},
		{name: "reg-raw-registry", steps: []step{
			startPlugin(rawDef("p", resA, fourA).viaRegistry()),
			expect(resA + "=4/4"),
			admit(a2),
		}},
		{name: "reg-bad-version", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet, version: "v1alpha1"}),
			capacityNow(),
		}},
		{name: "reg-bad-name", steps: []step{
			startPlugin(rawDef("p", "nodomain", fourA)),
			capacityNow(),
		}},
		{name: "reg-registry-bad-ver", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaRegistry, version: "v1alpha1"}),
			capacityNow(),
		}},
		{name: "reg-registry-bad-name", steps: []step{
			startPlugin(rawDef("p", "nodomain", fourA).viaRegistry()),
			capacityNow(),
		}},
		{name: "reg-stream-ends", steps: []step{
			startPlugin(rawDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 1))),
			endStreams("p"),
			expect(resA + "=4/0"),
			register("p"),
			expect(resA + "=4/4"),
			admit(pod("p2", ctr("main", resA, 3))),
		}},
		{name: "reg-unreachable", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet}),
			removeSocket("p"),
			register("p"),
			capacityNow(),
		}},
		{name: "reg-list-held", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet, holdList: true}),
			capacityNow(),
			admit(pod("p1", ctr("main", resA, 1))),
			releaseList("p"),
			expect(resA + "=4/4"),
		}},
		{name: "reg-list-held-stop", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet, holdList: true}),
			stopPlugin("p"),
			expect(resA + "=0/0"),
			admit(pod("p1", ctr("main", resA, 1))),
		}},
		{name: "reg-same-socket", steps: []step{
			startPlugin(rawDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			register("p"),
			list("p", healthyDev("a0"), healthyDev("a1"), unhealthyDev("a2")),
			expect(resA + "=3/2"),
			stopPlugin("p"),
			expect(resA + "=3/0"),
		}},
		{name: "reg-second-instance", steps: []step{
			startPlugin(sdkDef("old", resA, fourA).withInstance("i1")),
			expect(resA + "=4/4"),
			startPlugin(sdkDef("new", resA, healthy("a0", "a1", "a2", "a3", "a4", "a5")).withInstance("i2")),
			expect(resA + "=6/6"),
			admit(a2),
			stopPlugin("old"),
			list("new", healthy("a0", "a1", "a2", "a3", "a4")...),
			expect(resA + "=5/5"),
			admit(pod("p2", ctr("main", resA, 3))),
			stopPlugin("new"),
			expect(resA + "=5/0"),
		}},
		{name: "reg-old-instance-lists", steps: []step{
			startPlugin(rawDef("old", resA, fourA)),
			expect(resA + "=4/4"),
			startPlugin(rawDef("new", resA, healthy("a0", "a1"))),
			expect(resA + "=2/2"),
			list("old", healthy("a0", "a1", "a2")...),
			expect(resA + "=3/3"),
			list("new", healthy("a0")...),
			expect(resA + "=1/1"),
		}},

		// Accounting.
		{name: "acct-health-flip", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			list("p", healthyDev("a0"), unhealthyDev("a1"), healthyDev("a2"), healthyDev("a3")),
			expect(resA + "=4/3"),
			admit(pod("p1", ctr("main", resA, 3))),
			list("p", fourA...),
			expect(resA + "=4/4"),
			admit(pod("p2", ctr("main", resA, 1))),
		}},
		{name: "acct-shrink-grow", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 1))),
			list("p", healthy("a2", "a3")...),
			expect(resA + "=2/2"),
			admit(pod("p1", ctr("main", resA, 1))),
			admit(pod("p2", ctr("main", resA, 2))),
			list("p", healthy("a0", "a1", "a2", "a3", "a4", "a5")...),
			expect(resA + "=6/6"),
			admit(pod("p3", ctr("main", resA, 3))),
		}},
		{name: "acct-empty-list", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			list("p"),
			expect(resA + "=0/0"),
			admit(pod("p1", ctr("main", resA, 1))),
			list("p", fourA...),
			expect(resA + "=4/4"),
		}},
		{name: "acct-first-list-empty", steps: []step{
			startPlugin(rawDef("p", resA, nil)),
			expect(resA + "=0/0"),
		}},
		{name: "acct-unknown-health", steps: []step{
			startPlugin(rawDef("p", resA, []dev{healthyDev("a0"), {id: "a1", health: "Unknown"}, {id: "a2", health: "healthy"}, healthyDev("a3")})),
			expect(resA + "=4/2"),
			admit(pod("p1", ctr("main", resA, 2))),
		}},
		{name: "acct-duplicate-ids", steps: []step{
			startPlugin(rawDef("p", resA, []dev{healthyDev("a0"), healthyDev("a1"), healthyDev("a1"), healthyDev("a2")})),
			expect(resA + "=3/3"),
			admit(pod("p1", ctr("main", resA, 3))),
		}},
		{name: "acct-plugin-stop", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 1))),
			stopPlugin("p"),
			expect(resA + "=4/0"),
			admit(pod("p2", ctr("main", resA, 1))),
			startPlugin(sdkDef("p2", resA, fourA).withInstance("i2")),
			expect(resA + "=4/4"),
			admit(pod("p3", ctr("main", resA, 3))),
		}},
		{name: "acct-grace-period", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			startPlugin(sdkDef("q", resB, healthy("b0", "b1"))),
			expect(resA + "=4/4 " + resB + "=2/2"),
			admit(pod("p1", ctr("main", resA, 1))),
			stopPlugin("p"),
			stopPlugin("q"),
			expect(resA + "=4/0 " + resB + "=2/0"),
			restart(syscall.SIGKILL),
			expect(resA + "=0/0 " + resB + "=0/0"),
			graceExpires("none"),
			admit(pod("p2", ctr("main", resA, 1))),
			admit(pod("p3", ctr("main", resB, 1))),
			startPlugin(sdkDef("p2", resA, fourA).withInstance("i2")),
			expect(resA + "=4/4"),
			admit(pod("p4", ctr("main", resA, 3))),
		}},
		{name: "acct-two-resources", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			startPlugin(sdkDef("q", resB, healthy("b0", "b1"))),
			expect(resA + "=4/4 " + resB + "=2/2"),
			admit(pod("p1", ctr("main", resA, 1, resB, 1))),
			start("p1", "main"),
			stopPlugin("q"),
			expect(resA + "=4/4 " + resB + "=2/0"),
			admit(pod("p2", ctr("main", resB, 1))),
		}},

		// Admission.
		{name: "adm-insufficient", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 5))),
			admit(pod("p2", ctr("main", resA, 4))),
			admit(pod("p3", ctr("main", resA, 1))),
			deletePod("p2"),
			admit(pod("p4", ctr("main", resA, 1))),
		}},
		{name: "adm-unregistered", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resB, 1))),
			start("p1", "main"),
		}},
		{name: "adm-all-unhealthy", steps: []step{
			startPlugin(sdkDef("p", resA, []dev{unhealthyDev("a0"), unhealthyDev("a1")})),
			expect(resA + "=2/0"),
			admit(pod("p1", ctr("main", resA, 1))),
		}},
		{name: "adm-init-reuse", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 3)).withInit(ctr("init", resA, 2))),
			start("p1", "init"),
			start("p1", "main"),
			admit(pod("p2", ctr("main", resA, 1))),
			admit(pod("p3", ctr("main", resA, 1))),
		}},
		{name: "adm-sidecar", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 2)).withInit(sidecar("side", resA, 1))),
			admit(pod("p2", ctr("main", resA, 2))),
			admit(pod("p3", ctr("main", resA, 1))),
		}},
		{name: "adm-multi-container", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			startPlugin(sdkDef("q", resB, healthy("b0", "b1"))),
			expect(resA + "=4/4 " + resB + "=2/2"),
			admit(pod("p1", ctr("c1", resA, 1), ctr("c2", resA, 2, resB, 1), ctr("c3"))),
			start("p1", "c2"),
			start("p1", "c3"),
			admit(pod("p2", ctr("c1", resB, 2))),
		}},
		{name: "adm-partial-failure", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("c1", resA, 1), ctr("c2", resA, 4))),
			checkpointNow(),
			admit(pod("p2", ctr("main", resA, 4))),
		}},
		{name: "adm-delete-readmit", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 4))),
			deletePod("p1"),
			admit(pod("p2", ctr("main", resA, 4))),
		}},
		{name: "adm-allocate-error", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet, allocateError: "device a is on fire"}),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 2))),
			checkpointNow(),
		}},
		{name: "adm-empty-answer", steps: []step{
			startPlugin(pluginDef{name: "p", resource: resA, devices: fourA, via: viaKubelet, emptyAllocate: true}),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 2))),
			admit(pod("p2", ctr("main", resA, 4))),
		}},
		{name: "adm-no-preferred", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withoutPreferred()),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 4))),
			start("p1", "main"),
		}},
		{name: "adm-zero-request", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withPreStart()),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 0))),
			start("p1", "main"),
		}},
		{name: "adm-zero-plugin-gone", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			stopPlugin("p"),
			expect(resA + "=4/0"),
			admit(pod("p1", ctr("main", resA, 0))),
		}},

		// Topology (NUMA nodes 0 and 1).
		{name: "topo-best-effort", args: numa("best-effort", "container"), steps: []step{
			startPlugin(sdkDef("p", resA, onNUMA(map[int64][]string{0: {"a0", "a1"}, 1: {"a2", "a3", "a4"}}))),
			expect(resA + "=5/5"),
			admit(pod("p1", ctr("main", resA, 2))),
			admit(pod("p2", ctr("main", resA, 1))),
			admit(pod("p3", ctr("main", resA, 2))),
			admit(pod("p4", ctr("main", resA, 1))),
			start("p1", "main"),
		}},
		{name: "topo-multi-numa-dev", steps: []step{
			startPlugin(rawDef("p", resA, []dev{{id: "a0", health: pluginapi.Healthy, numa: []int64{0}}, {id: "a1", health: pluginapi.Healthy, numa: []int64{0, 1}}, healthyDev("a2")})),
			expect(resA + "=3/3"),
			admit(pod("p1", ctr("main", resA, 3))),
		}},
		{name: "topo-single-numa", args: numa("single-numa-node", "container"), steps: []step{
			startPlugin(sdkDef("p", resA, onNUMA(map[int64][]string{0: {"a0", "a1"}, 1: {"a2", "a3"}}))),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 3))),
			admit(pod("p2", ctr("main", resA, 1))),
			admit(pod("p3", ctr("main", resA, 2))),
			admit(pod("p4", ctr("main", resA, 1))),
		}},
		{name: "topo-pod-scope", args: numa("restricted", "pod"), steps: []step{
			startPlugin(sdkDef("p", resA, onNUMA(map[int64][]string{0: {"a0", "a1", "a2"}, 1: {"a3", "a4", "a5"}}))),
			expect(resA + "=6/6"),
			// The kubelet reuses init devices in Go map order: the app
			// containers take all of them, or none, to stay comparable.
			admit(pod("p1", ctr("c1", resA, 2), ctr("c2", resA, 1)).withInit(ctr("init", resA, 2))),
			admit(pod("p2", ctr("c1", resA, 2), ctr("c2", resA, 2))),
			admit(pod("p3", ctr("c1", resA, 1), ctr("c2", resA, 1))),
		}},

		// PreStartContainer.
		{name: "prestart", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withPreStart()),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 2)).withInit(ctr("init", resA, 1))),
			start("p1", "init"),
			start("p1", "main"),
		}},
		{name: "prestart-plugin-gone", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			stopPlugin("p"),
			expect(resA + "=4/0"),
			start("p1", "main"),
		}},

		{name: "prestart-req-gone", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withPreStart()),
			expect(resA + "=4/4"),
			admit(a2),
			stopPlugin("p"),
			expect(resA + "=4/0"),
			start("p1", "main"),
		}},

		// Restarts.
		{name: "restart-sigterm", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withPreStart()),
			expect(resA + "=4/4"),
			admit(a2),
			restart(syscall.SIGTERM),
			expect(resA + "=4/4"),
			admit(a2),
			start("p1", "main"),
			admit(pod("p2", ctr("main", resA, 2))),
			admit(pod("p3", ctr("main", resA, 1))),
		}},
		{name: "restart-sigkill", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			restart(syscall.SIGKILL),
			expect(resA + "=4/4"),
			admit(pod("p2", ctr("main", resA, 3))),
			admit(pod("p3", ctr("main", resA, 2))),
		}},
		{name: "restart-registry", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).viaRegistry()),
			expect(resA + "=4/4"),
			admit(a2),
			restart(syscall.SIGKILL),
			expect(resA + "=4/4"),
			admit(a2),
			admit(pod("p2", ctr("main", resA, 3))),
		}},
		{name: "restart-plugin-late", steps: []step{
			startPlugin(rawDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			admit(pod("p2", ctr("main", resA, 1))),
			restart(syscall.SIGTERM),
			expect(resA + "=0/0"),
			admit(a2),
			serveAgain("p"),
			expect(resA + "=4/4"),
			admit(pod("p2", ctr("main", resA, 1))),
			admit(pod("p3", ctr("main", resA, 3))),
		}},
		{name: "restart-pod-gone", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 4))),
			stopManagerOnly(syscall.SIGTERM),
			forget("p1"),
			kubeletStarts(),
			expect(resA + "=4/4"),
			admit(pod("p2", ctr("main", resA, 4))),
		}},
		{name: "restart-corrupt-cp", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			stopManagerOnly(syscall.SIGTERM),
			corruptCheckpoint(),
			kubeletStarts(),
			expect(resA + "=4/4"),
			admit(a2),
			admit(pod("p2", ctr("main", resA, 2))),
		}},
		{name: "restart-start-restored", steps: []step{
			startPlugin(sdkDef("p", resA, fourA).withPreStart()),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 2)).withInit(ctr("init", resA, 1))),
			restart(syscall.SIGKILL),
			expect(resA + "=4/4"),
			start("p1", "main"),
			admit(pod("p2", ctr("main", resA, 3))),
		}},
		{name: "restart-readmit", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			admit(a2),
			admit(pod("p2", ctr("main", resA, 1))),
			restart(syscall.SIGKILL),
			expect(resA + "=4/4"),
			list("p", healthyDev("a0"), unhealthyDev("a1"), healthyDev("a2"), healthyDev("a3")),
			expect(resA + "=4/3"),
			admit(a2),
			admit(pod("p2", ctr("main", resA, 3))),
			admit(pod("p3", ctr("main", resA, 2))),
		}},
		{name: "restart-health-flip", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			list("p", healthyDev("a0"), unhealthyDev("a1"), healthyDev("a2"), healthyDev("a3")),
			expect(resA + "=4/3"),
			restart(syscall.SIGTERM),
			expect(resA + "=4/3"),
		}},
		{name: "restart-twice", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			startPlugin(sdkDef("q", resB, healthy("b0", "b1")).viaRegistry()),
			expect(resA + "=4/4 " + resB + "=2/2"),
			admit(pod("p1", ctr("main", resA, 1, resB, 1))),
			restart(syscall.SIGKILL),
			expect(resA + "=4/4 " + resB + "=2/2"),
			restart(syscall.SIGTERM),
			expect(resA + "=4/4 " + resB + "=2/2"),
			admit(pod("p1", ctr("main", resA, 1, resB, 1))),
			admit(pod("p2", ctr("main", resA, 3, resB, 1))),
		}},

		// Removal.
		{name: "socket-deleted-sdk", steps: []step{
			startPlugin(sdkDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			removeSocket("p"),
			registeredAgain("p"),
			list("p", healthy("a0", "a1", "a2")...),
			expect(resA + "=3/3"),
			admit(a2),
		}},
		{name: "socket-deleted-raw", steps: []step{
			startPlugin(rawDef("p", resA, fourA)),
			expect(resA + "=4/4"),
			removeSocket("p"),
			list("p", healthy("a0", "a1", "a2")...),
			expect(resA + "=3/3"),
			admit(a2),
		}},
		{name: "registry-socket-gone", steps: []step{
			startPlugin(rawDef("p", resA, fourA).viaRegistry()),
			expect(resA + "=4/4"),
			admit(pod("p1", ctr("main", resA, 1))),
			removeSocket("p"),
			expect(resA + "=4/0"),
			admit(pod("p2", ctr("main", resA, 1))),
			serveAgain("p"),
			expect(resA + "=4/4"),
			admit(pod("p3", ctr("main", resA, 3))),
		}},
	}
}
