package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/verify"
	"github.com/dpkit/dpkit/pkg/verify/draverify"
)

// draRBAC is the RBAC of a DRA driver on the kubeletplugin helper, as its
// manifests would ship it: what dpkit's deploy/components/dra/rbac.yaml
// grants, with a binding and a ServiceAccount beside it (verify leaves
// those out). lacking drops one verb of one rule.
func draRBAC(claimVerbs string) string {
	return `apiVersion: v1
kind: ServiceAccount
metadata: {name: my-driver, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: my-driver}
rules:
- apiGroups: [resource.k8s.io]
  resources: [resourceslices]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [` + claimVerbs + `]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: my-driver}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: my-driver}
subjects: [{kind: ServiceAccount, name: my-driver, namespace: kube-system}]
`
}

// TestVerifyDRARBAC runs dpkit verify --dra with the RBAC a driver
// documents: the upstream helper's fake driver given what it needs passes
// dra.rbac; dpkit plugin and the fake driver given an --rbac file that
// lacks get on resourceclaims fail dra.rbac, which names the verb and the
// resource, and no other check (those that cannot be judged without the
// claims are skipped with "see dra.rbac").
func TestVerifyDRARBAC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full, lacking := write("rbac.yaml", draRBAC("get")), write("lacking.yaml", draRBAC("list, watch"))
	config := write("fake-dra.yaml", fakeDRAConfig)
	fakedra := []string{dratest.Binary(t), "--registry-dir", "{registry-dir}", "--kubeconfig", "{kubeconfig}", "--node-name", "{node-name}", "--resend", "500ms"}
	for _, tc := range []struct {
		name    string
		rbac    string
		command []string
		denied  bool
	}{
		{"the upstream helper with its RBAC", full, fakedra, false},
		{"the upstream helper without get on resourceclaims", lacking, fakedra, true},
		{"dpkit plugin without get on resourceclaims", lacking, []string{dpkitBinary(t), "plugin", "--config", config}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			extra := []string{"--rbac", tc.rbac}
			if tc.command[0] != dpkitBinary(t) {
				extra = append(extra, "--health-timeout", "2s")
			}
			rep, code := runVerifyDRA(t, extra, tc.command...)
			res := result(t, rep, verify.CheckDRARBAC)
			if !tc.denied {
				if res.Verdict != verify.Pass || !strings.Contains(res.Detail, tc.rbac) {
					t.Errorf("%s: %s (%s), want a pass granted %s", verify.CheckDRARBAC, res.Verdict, res.Detail, tc.rbac)
				}
				return
			}
			if res.Verdict != verify.Fail || !strings.Contains(res.Detail, `get resource "resourceclaims" in API group "resource.k8s.io"`) {
				t.Errorf("%s: %s (%s), want a failure naming get on resourceclaims", verify.CheckDRARBAC, res.Verdict, res.Detail)
			}
			if got := failedChecks(rep); code != 1 || !slices.Equal(got, []string{verify.CheckDRARBAC}) {
				t.Errorf("exit %d, failed checks %v; want exit 1 and %s alone", code, got, verify.CheckDRARBAC)
			}
			if r := result(t, rep, verify.CheckDRAPrepare); r.Verdict != verify.Skip || !strings.HasPrefix(r.Detail, "see "+verify.CheckDRARBAC) {
				t.Errorf("%s: %s (%s), want it skipped: see %s", r.ID, r.Verdict, r.Detail, verify.CheckDRARBAC)
			}
		})
	}
}

// result is the result of check id in rep.
func result(t *testing.T, rep *verify.Report, id string) verify.Result {
	t.Helper()
	i := slices.IndexFunc(rep.Results, func(r verify.Result) bool { return r.ID == id })
	if i < 0 {
		t.Fatalf("no result of %s", id)
	}
	return rep.Results[i]
}

// TestVerifyDRAKilled kills dpkit verify --dra with SIGKILL in the middle
// of a run, while its claims are there, its driver (which has forked a
// process of its own) runs and has published its ResourceSlice; then
// runs dpkit verify --dra --cleanup. The driver dies with verify; the
// process it forked is killed by --cleanup; nothing of the run is left on
// the API server (objects by the run's label, the driver's slice by its
// Node's UID though the Node is gone) or on disk; a Node of the same name
// that someone else made after the run's was deleted stays, with its
// ResourceSlice.
func TestVerifyDRAKilled(t *testing.T) {
	t.Parallel()
	cp := cluster.Get(t)
	client := cp.Client()
	ctx := t.Context()
	// The example --help gives.
	config, err := filepath.Abs(filepath.Join("..", "..", "examples", "fake-dra.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dpkit := dpkitBinary(t)
	// dpkit-cluster runs the verification: dpkit hands it over, and
	// passes a SIGTERM on, not a SIGKILL.
	verifier := filepath.Join(filepath.Dir(dpkit), "dpkit-cluster")
	cmd := exec.Command(verifier, "--log-level", "debug", "verify", "--dra", "--kubeconfig", cp.Kubeconfig, "-o", "json", "--",
		"sh", "-c", `sleep 600 & exec "$@"`, "sh", dpkit, "plugin", "--config", config)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	// The run's ID and root, then the Prepare checks done: the claims
	// are there.
	setUp := regexp.MustCompile(`msg="Verify run set up" run=([a-z0-9]+) .* root=(\S+)`)
	var id, root string
	var log bytes.Buffer
	prepared := false
	lines := bufio.NewScanner(io.TeeReader(stderr, &log))
	for !prepared && lines.Scan() {
		if m := setUp.FindStringSubmatch(lines.Text()); m != nil {
			id, root = m[1], m[2]
		}
		prepared = strings.Contains(lines.Text(), "check="+verify.CheckDRAPrepare+" ")
	}
	if id == "" || !prepared {
		t.Fatalf("no run set up and prepared (%v); verify's log:\n%s", lines.Err(), log.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	selector := metav1.ListOptions{LabelSelector: draverify.RunLabel + "=" + id}
	nodes, err := client.CoreV1().Nodes().List(ctx, selector)
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the run's Node: %v, %v", nodes, err)
	}
	node := nodes.Items[0]
	if claims := labelled(t, client, id); !slices.ContainsFunc(claims, func(s string) bool { return strings.HasPrefix(s, "ResourceClaim ") }) {
		t.Fatalf("the run's objects %v: want its claims among them", claims)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	// The driver dies with verify; what it forked does not.
	var procs []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		procs = runProcesses(id)
		if slices.Equal(procs, []string{"sleep"}) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(procs, []string{"sleep"}) {
		t.Errorf("processes of the run after verify was killed: %q, want the driver gone and only its forked sleep left", procs)
	}
	if _, err := os.Stat(root); err != nil {
		t.Errorf("the run's root %s after verify was killed: %v, want it left for --cleanup", root, err)
	}
	slices0, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + node.Name})
	if err != nil || len(slices0.Items) == 0 {
		t.Fatalf("the driver's ResourceSlices: %v, %v; want them there", slices0, err)
	}

	// Someone deletes the run's Node and makes one of the same name, with
	// a ResourceSlice of theirs for it.
	if err := client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	theirs, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	theirSlice, err := client.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name + "-theirs",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: theirs.Name, UID: theirs.UID}}},
		Spec: resourcev1.ResourceSliceSpec{Driver: "theirs.example.com", NodeName: &theirs.Name,
			Pool: resourcev1.ResourcePool{Name: "theirs", ResourceSliceCount: 1}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceSlices().Delete(t.Context(), theirSlice.Name, metav1.DeleteOptions{})
		_ = client.CoreV1().Nodes().Delete(t.Context(), theirs.Name, metav1.DeleteOptions{})
	})

	out, errOut, code := dpkitRun(t, ctx, "", "verify", "--dra", "--cleanup", "--kubeconfig", cp.Kubeconfig, "-o", "json")
	var rep verify.DRACleanupReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("dpkit verify --dra --cleanup: exit %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errOut)
	}
	var mine []string
	for _, l := range rep.Leftovers {
		if l.Run == id {
			mine = append(mine, l.Action+" "+l.Object)
		}
	}
	t.Logf("dpkit verify --dra --cleanup, of run %s:\n  %s", id, strings.Join(mine, "\n  "))
	if !slices.ContainsFunc(mine, func(s string) bool { return regexp.MustCompile(`^killed process \d+ \(sleep\)$`).MatchString(s) }) {
		t.Errorf("--cleanup did not say it killed the forked sleep")
	}

	if left := labelled(t, client, id); len(left) > 0 {
		t.Errorf("objects of the run left after --cleanup: %v", left)
	}
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sl.Items {
		if slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == node.UID }) {
			t.Errorf("ResourceSlice %s of the run's Node left", s.Name)
		}
	}
	if n, err := client.CoreV1().Nodes().Get(ctx, theirs.Name, metav1.GetOptions{}); err != nil || n.UID != theirs.UID {
		t.Errorf("someone else's Node %s: %v, %v; want it kept", theirs.Name, n, err)
	}
	if _, err := client.ResourceV1().ResourceSlices().Get(ctx, theirSlice.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("someone else's ResourceSlice %s: %v; want it kept", theirSlice.Name, err)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the run's root %s after --cleanup: %v, want it gone", root, err)
	}
	if procs := runProcesses(id); len(procs) > 0 {
		t.Errorf("processes of the run after --cleanup: %q", procs)
	}
}

// labelled lists the objects of run id on the API server.
func labelled(t *testing.T, client kubernetes.Interface, id string) []string {
	t.Helper()
	ctx, o := t.Context(), metav1.ListOptions{LabelSelector: draverify.RunLabel + "=" + id}
	var out []string
	add := func(kind string, items []metav1.Object, err error) {
		if err != nil {
			t.Errorf("list %ss: %v", kind, err)
		}
		for _, m := range items {
			out = append(out, kind+" "+m.GetNamespace()+"/"+m.GetName())
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, o)
	add("Node", metas(nodes.Items), err)
	nss, err := client.CoreV1().Namespaces().List(ctx, o)
	add("Namespace", metas(nss.Items), err)
	sas, err := client.CoreV1().ServiceAccounts("").List(ctx, o)
	add("ServiceAccount", metas(sas.Items), err)
	crs, err := client.RbacV1().ClusterRoles().List(ctx, o)
	add("ClusterRole", metas(crs.Items), err)
	crbs, err := client.RbacV1().ClusterRoleBindings().List(ctx, o)
	add("ClusterRoleBinding", metas(crbs.Items), err)
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, o)
	add("ResourceClaim", metas(claims.Items), err)
	return out
}

func metas[T any, PT interface {
	*T
	metav1.Object
}](items []T) []metav1.Object {
	out := make([]metav1.Object, len(items))
	for i := range items {
		out[i] = PT(&items[i])
	}
	return out
}

// runProcesses names the processes, still running, with run id in their
// environment (DPKIT_VERIFY_RUN).
func runProcesses(id string) []string {
	var out []string
	for _, pid := range procfs.PIDs() {
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "DPKIT_VERIFY_RUN="+id) {
			continue
		}
		if st, err := procfs.ReadStat(pid); err != nil || st.Exited() {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		out = append(out, strings.TrimSpace(string(comm)))
	}
	slices.Sort(out)
	return out
}
