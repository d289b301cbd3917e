package draverify

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/pkg/verify"
)

// deadOwner is the owner of a process that has ended.
func deadOwner(t *testing.T) owner {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	o := self()
	o.PID = cmd.Process.Pid
	return o
}

// TestOwnerAlive: a run goes on while its verify process runs; a process
// of the same ID started later (another start time), one of an earlier
// boot, or none is a run that ended; a run of another host cannot be told.
func TestOwnerAlive(t *testing.T) {
	t.Parallel()
	me := self()
	if me.Start == 0 || me.BootID == "" {
		t.Skip("no /proc start time or boot ID on this system")
	}
	reused, earlierBoot, elsewhere := me, me, me
	reused.Start++
	earlierBoot.BootID = "another-boot"
	elsewhere.Host += ".elsewhere"
	for _, tc := range []struct {
		name string
		o    owner
		want liveness
	}{
		{"this process", me, ownerRuns},
		{"a process that ended", deadOwner(t), ownerGone},
		{"the ID of a later process", reused, ownerGone},
		{"an earlier boot", earlierBoot, ownerGone},
		{"another host", elsewhere, ownerUnknown},
	} {
		if got := tc.o.alive(); got != tc.want {
			t.Errorf("%s (%+v): %d, want %d", tc.name, tc.o, got, tc.want)
		}
	}
	// What the driver's environment holds says the same.
	o, ok := parseOwnerEnv(me.env())
	if !ok || o != me {
		t.Errorf("parseOwnerEnv(%q) = %+v, %v; want %+v", me.env(), o, ok, me)
	}
}

// TestRunRecord: the record a run writes into its root reads back.
func TestRunRecord(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	rec := runRecord{Run: "abc123", Owner: self(), Started: time.Now().UTC().Round(0), Node: testName, Namespace: testName, NodeUID: "uid-1"}
	if err := writeRecord(root, rec); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(root)
	if err != nil || !got.Started.Equal(rec.Started) {
		t.Fatalf("readRecord: %+v, %v; want %+v", got, err, rec)
	}
	got.Started = rec.Started
	if got != rec {
		t.Errorf("readRecord: %+v, want %+v", got, rec)
	}
	if fi, err := os.Stat(filepath.Join(root, recordFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file: %v, %v; want mode 0600", fi, err)
	}
}

// startDriver starts a process with run in its environment, owned by o.
func startDriver(t *testing.T, run string, o owner) runProcess {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = append(os.Environ(), envRun+"="+run, envOwner+"="+o.env())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return runProcess{pid: cmd.Process.Pid}
}

// TestRunProcesses: the processes of a run are found by the run in their
// environment, with their owner.
func TestRunProcesses(t *testing.T) {
	t.Parallel()
	me := self()
	p := startDriver(t, "procs1", me)
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs := runProcesses() // once: processes of parallel tests come and go
		i := slices.IndexFunc(procs, func(q runProcess) bool { return q.pid == p.pid })
		if i >= 0 {
			q := procs[i]
			if q.run != "procs1" || !q.hasOwner || q.owner != me || q.name == "" {
				t.Errorf("found %+v, want run procs1 of %+v", q, me)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d with %s=procs1 not found", p.pid, envRun)
		}
		time.Sleep(10 * time.Millisecond) // until exec has replaced the environment
	}
}

// TestCleanupOrphans: --cleanup removes what runs that ended left (the
// root, the driver's processes, the objects on the API server) and leaves
// alone what runs that go on have, what runs of another host have, and a
// directory without a run record.
func TestCleanupOrphans(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	dead, live := deadOwner(t), self()
	elsewhere := live
	elsewhere.Host += ".elsewhere"
	mkroot := func(rec runRecord) string {
		dir, err := os.MkdirTemp(tmp, "dpvd")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Run != "" {
			if err := writeRecord(dir, rec); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	deadRoot := mkroot(runRecord{Run: "dead01", Owner: dead, NodeUID: "uid-gone-node"})
	liveRoot := mkroot(runRecord{Run: "live01", Owner: live})
	noRecord := mkroot(runRecord{})
	deadDriver := startDriver(t, "dead01", dead)
	// A process the driver forked, whose root is gone: its owner, in
	// its environment, has ended.
	orphan := startDriver(t, "gone01", dead)
	liveDriver := startDriver(t, "live01", live)
	procs := []runProcess{
		{pid: deadDriver.pid, name: "sleep", run: "dead01", owner: dead, hasOwner: true},
		{pid: orphan.pid, name: "sleep", run: "gone01", owner: dead, hasOwner: true},
		{pid: liveDriver.pid, name: "sleep", run: "live01", owner: live, hasOwner: true},
	}

	annotated := func(kind runtime.Object, id string, o owner) runtime.Object {
		m := kind.(metav1.Object)
		a, _ := json.Marshal(o)
		m.SetLabels(map[string]string{RunLabel: id})
		m.SetAnnotations(map[string]string{ownerAnnotation: string(a)})
		m.SetUID(types.UID("uid-" + m.GetName()))
		return kind
	}
	var objs []runtime.Object
	for _, r := range []struct {
		id string
		o  owner
	}{{"dead01", dead}, {"live01", live}, {"away01", elsewhere}, {"api001", dead}} {
		objs = append(objs,
			annotated(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dpkit-verify-" + r.id}}, r.id, r.o),
			annotated(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dpkit-verify-" + r.id}}, r.id, r.o))
	}
	objs = append(objs, slice("of-a-gone-node", "dpkit-verify-old", "uid-gone-node"))
	client := fake.NewClientset(objs...)
	apiServer(t, client)
	c := &orphans{
		cfg:       verify.DRACleanupConfig{TempDir: tmp, CallTimeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)},
		processes: func() []runProcess { return procs },
		connect:   func() (*sweeper, error) { return newSweeper(client), nil },
	}
	rep, err := c.run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range rep.Leftovers {
		got = append(got, l.Run+" "+l.Action+" "+l.Object)
	}
	slices.Sort(got)
	want := []string{
		" kept directory " + noRecord,
		"api001 removed Namespace dpkit-verify-api001",
		"api001 removed Node dpkit-verify-api001",
		"away01 kept Namespace dpkit-verify-away01",
		"dead01 killed process " + strconv.Itoa(deadDriver.pid) + " (sleep)",
		"dead01 removed Namespace dpkit-verify-dead01",
		"dead01 removed Node dpkit-verify-dead01",
		"dead01 removed ResourceSlice of-a-gone-node",
		"dead01 removed directory " + deadRoot,
		"gone01 killed process " + strconv.Itoa(orphan.pid) + " (sleep)",
		"live01 kept directory " + liveRoot,
	}
	if !slices.Equal(got, want) {
		t.Errorf("report:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, p := range []runProcess{deadDriver, orphan} {
		waitExited(t, p.pid)
	}
	if st, err := procfs.ReadStat(liveDriver.pid); err != nil || st.Exited() {
		t.Errorf("the driver of the run that goes on: %v, %v; want it running", st, err)
	}
	for _, dir := range []string{liveRoot, noRecord} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v, want it kept", dir, err)
		}
	}
	if _, err := os.Stat(deadRoot); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it removed", deadRoot, err)
	}
	wantLeft := []string{"Namespace dpkit-verify-away01", "Namespace dpkit-verify-live01", "Node dpkit-verify-away01", "Node dpkit-verify-live01"}
	if got := left(t, client); !slices.Equal(got, wantLeft) {
		t.Errorf("left on the API server %q, want %q", got, wantLeft)
	}
}

// waitExited waits until process pid has ended (a zombie counts).
func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := procfs.ReadStat(pid)
		if err != nil || st.Exited() {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("process %d still runs", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDriverEnv: the driver's environment has its own kubeconfig, the
// run and its owner, and none of verify's ways to the API server.
func TestDriverEnv(t *testing.T) {
	t.Parallel()
	r := &run{kubeconfig: "/tmp/dpvd1/kubeconfig", sb: &sandbox{id: "abc123", owner: owner{PID: 42, Start: 7, BootID: "b"}}}
	got := r.driverEnv([]string{"PATH=/bin", "KUBECONFIG=/home/me/.kube/config", "KUBERNETES_SERVICE_HOST=10.0.0.1",
		"KUBERNETES_SERVICE_PORT=443", envRun + "=old", "HOME=/home/me"})
	want := []string{"PATH=/bin", "HOME=/home/me", "KUBECONFIG=/tmp/dpvd1/kubeconfig", envRun + "=abc123", envOwner + "=42:7:b"}
	if !slices.Equal(got, want) {
		t.Errorf("driverEnv:\n  %q\nwant\n  %q", got, want)
	}
}

// TestDriverKubeconfig: the driver's kubeconfig has the proxy, its
// certificate authority and the driver's token: one context, nothing of
// verify's.
func TestDriverKubeconfig(t *testing.T) {
	t.Parallel()
	r := &run{root: t.TempDir(), ns: testName, sb: &sandbox{proxy: &apiProxy{url: "https://127.0.0.1:4242", caPEM: []byte("the run's CA")}}}
	if err := r.writeDriverKubeconfig("driver-token"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(r.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Clusters) != 1 || len(cfg.AuthInfos) != 1 || len(cfg.Contexts) != 1 {
		t.Fatalf("kubeconfig %+v: want one cluster, one user, one context", cfg)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	cluster, user := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cluster.Server != "https://127.0.0.1:4242" || string(cluster.CertificateAuthorityData) != "the run's CA" || cluster.InsecureSkipTLSVerify || ctx.Namespace != testName {
		t.Errorf("cluster %+v, context %+v: want the proxy, its CA, the run's namespace", cluster, ctx)
	}
	if user.Token != "driver-token" || user.ClientCertificateData != nil || user.ClientKeyData != nil || user.Exec != nil || user.Username != "" || user.TokenFile != "" {
		t.Errorf("user %+v: want the driver's token alone", user)
	}
	if fi, err := os.Stat(r.kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig file: %v, %v; want mode 0600", fi, err)
	}
}
