package draverify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/verify"
)

// The run's setup (the temporary root and its run record, what it
// creates on the API server, the driver's access, the driver's process)
// and its clean-up.

func (r *run) setup(ctx context.Context) error {
	g, err := loadGrant(r.cfg.RBAC)
	if err != nil {
		return err
	}
	rc := clientConfig(r.api)
	r.client, err = kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("API server client: %w", err)
	}
	content, err := newAPIContent(rc)
	if err != nil {
		return fmt.Errorf("API server client: %w", err)
	}
	id := rand.String(6)
	r.sb = &sandbox{id: id, owner: self(), ctx: ctx, grant: g, upstream: rc, content: content}
	r.node = "dpkit-verify-" + id
	r.ns = "dpkit-verify-" + id
	r.podUID = types.UID("dpkit-verify-pod-" + id)

	// A root of a fixed length, as short as the kubelet's
	// /var/lib/kubelet in /tmp: the driver's sockets below it (a
	// registrar named after the driver and a 36-character pod UID) must
	// fit a unix socket path's 107 bytes wherever they fit on a node.
	// os.MkdirTemp's name is up to 10 digits, of a length that varies.
	root := filepath.Join(os.TempDir(), rootPrefix+id)
	if err := os.Mkdir(root, 0o700); err != nil {
		return fmt.Errorf("create the temporary kubelet root: %w", err)
	}
	r.root = root
	// First of all, what tells --cleanup whether the run goes on.
	r.sb.record = runRecord{Run: id, Owner: r.sb.owner, Started: time.Now().UTC(), Node: r.node, Namespace: r.ns}
	if err := writeRecord(root, r.sb.record); err != nil {
		return fmt.Errorf("write the run record: %w", err)
	}
	r.registryDir = filepath.Join(root, "plugins_registry")
	r.pluginsDir = filepath.Join(root, "plugins")
	r.cdiDir = filepath.Join(root, "cdi")
	r.stateDir = filepath.Join(root, "kubelet")
	for _, d := range []string{r.registryDir, r.pluginsDir, r.cdiDir, r.stateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	r.log.Debug("Verify run set up", "run", id, "node", r.node, "namespace", r.ns, "root", root)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	// The slices' owner: the driver looks the Node up.
	nodeMeta := r.sb.ownerMeta(r.node)
	nodeMeta.Labels["dpkit.io/verify"] = "true"
	node, err := r.client.CoreV1().Nodes().Create(cctx, &corev1.Node{ObjectMeta: nodeMeta}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s on the API server: %w", r.node, err)
	}
	r.sb.record.NodeUID = node.UID
	if err := writeRecord(root, r.sb.record); err != nil {
		return fmt.Errorf("write the run record: %w", err)
	}
	if _, err := r.client.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: r.sb.ownerMeta(r.ns)}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Namespace %s on the API server: %w", r.ns, err)
	}
	if err := r.giveAccess(ctx); err != nil {
		return err
	}
	if err := r.watchSlices(ctx); err != nil {
		r.log.Debug("Cannot watch ResourceSlices", "err", err)
	}
	if err := r.startKubelet(); err != nil {
		return err
	}
	r.driverPod = uuid.NewUUID()
	r.command, r.env = r.driverCommand(r.driverPod)
	r.proc, err = verifyproc.Start(r.command, r.env)
	return err
}

// driverCommand is the driver's command and environment for an instance
// in the pod pod: a restart keeps its pod, the second instance of a
// rolling update has another.
func (r *run) driverCommand(pod types.UID) (command, env []string) {
	vals := map[string]string{
		verifyproc.PlaceholderRegistryDir: r.registryDir, verifyproc.PlaceholderPluginsDir: r.pluginsDir,
		verifyproc.PlaceholderCDIDir: r.cdiDir, verifyproc.PlaceholderNodeName: r.node, verifyproc.PlaceholderKubeconfig: r.kubeconfig,
		verifyproc.PlaceholderPodUID: string(pod),
	}
	command = verifyproc.ExpandArgs(r.cfg.Command, vals)
	env = append(r.driverEnv(r.cfg.Env),
		verifyproc.EnvRegistryDir+"="+r.registryDir, verifyproc.EnvDRAPluginsDir+"="+r.pluginsDir,
		verifyproc.EnvCDIDir+"="+r.cdiDir, verifyproc.EnvNodeName+"="+r.node, verifyproc.EnvPodUID+"="+string(pod))
	return command, env
}

// clientConfig is a copy of api, the client configuration verify was
// given, with verify's rate limits.
func clientConfig(api *rest.Config) *rest.Config {
	rc := rest.CopyConfig(api)
	if rc.QPS == 0 && rc.RateLimiter == nil {
		// client-go's default, 5 a second, makes clean-up wait
		// seconds for its dozens of calls.
		rc.QPS, rc.Burst = 50, 100
	}
	return rc
}

// giveAccess makes the driver's ServiceAccount and RBAC, its token, the
// proxy and the driver's kubeconfig.
func (r *run) giveAccess(ctx context.Context) error {
	if err := r.grantDriver(ctx); err != nil {
		return err
	}
	token, err := r.driverToken(ctx)
	if err != nil {
		return err
	}
	if err := r.waitGranted(ctx, token); err != nil {
		return err
	}
	r.sb.proxy, err = startProxy(r.sb.upstream, r.tokenLifetime(), r.log)
	if err != nil {
		return fmt.Errorf("start the driver's proxy to the API server: %w", err)
	}
	return r.writeDriverKubeconfig(token)
}

func (r *run) cleanup() {
	if r.proc != nil {
		r.proc.Kill()
	}
	if r.health != nil {
		r.health.stop()
	}
	if r.slices != nil {
		r.slices.stop()
	}
	if r.conn != nil {
		_ = r.conn.Close()
	}
	r.stopKubelet()
	if r.sb == nil {
		return
	}
	if r.sb.proxy != nil {
		// The driver is gone: what the proxy saw is all.
		r.judgeRBAC()
		r.sb.proxy.stop()
	}
	if r.client != nil {
		s := &sweeper{client: r.client, content: r.sb.content, log: r.log, timeout: r.cfg.CallTimeout, controllerWait: namespaceControllerWait}
		// Not a finding about the driver, but what the user has to
		// remove by hand.
		for _, l := range s.sweep(r.sb.id, r.sb.record.NodeUID) {
			r.log.Warn("Cannot remove an object verify --dra created on the API server", "object", l.object, "why", l.why, "remove", l.remove)
		}
	}
	if r.root != "" {
		_ = os.RemoveAll(r.root)
	}
}

// judgeRBAC decides dra.rbac once the driver is gone: a fail naming what
// the API server forbade it, a pass when it forbade nothing.
func (r *run) judgeRBAC() {
	res := r.results[verify.CheckDRARBAC]
	if res == nil {
		return
	}
	pass, detail, err := r.sb.proxy.rbacVerdict(r.sb.grant.source)
	switch {
	case err == nil && pass:
		if r.sb.ctx.Err() != nil {
			return // interrupted: not judged
		}
		res.Verdict, res.Detail = verify.Pass, detail
	case err == nil:
		res.Verdict, res.Detail = verify.Fail, detail
	case r.sb.ctx.Err() == nil:
		res.Verdict, res.Detail = verify.Skip, "the driver made no request to the API server"
	}
	r.log.Debug("Check done", "check", verify.CheckDRARBAC, "verdict", res.Verdict, "detail", res.Detail)
}

// oneCause keeps dra.rbac for judgeRBAC, and, once the API server has
// forbidden the driver a request, makes another check's failure a skip
// that points to dra.rbac: one cause, one failure (a driver that cannot
// read a claim fails to prepare it).
func (r *run) oneCause(id string, res *verify.Result) {
	switch {
	case r.sb == nil:
	case id == verify.CheckDRARBAC:
		*res = verify.Result{}
	case res.Verdict == verify.Fail && r.sb.proxy != nil && r.sb.proxy.anyDenied():
		res.Verdict, res.Detail = verify.Skip, "see "+verify.CheckDRARBAC+" ("+res.Detail+")"
	}
}
