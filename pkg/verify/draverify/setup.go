package draverify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
	"github.com/dpkit/dpkit/pkg/verify"
)

// The run's setup (the temporary root, what it creates on the API server,
// the driver's process) and its clean-up.

func (r *run) setup(ctx context.Context) error {
	kc := r.cfg.Kubeconfig
	rc, err := kubeconfigpkg.Load(kc)
	if err != nil {
		return fmt.Errorf("--kubeconfig: verify --dra needs an API server: %w", err)
	}
	r.client, err = kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	root, err := os.MkdirTemp("", "dpvd")
	if err != nil {
		return fmt.Errorf("create the temporary kubelet root: %w", err)
	}
	r.root = root
	r.registryDir = filepath.Join(root, "plugins_registry")
	r.pluginsDir = filepath.Join(root, "plugins")
	r.cdiDir = filepath.Join(root, "cdi")
	r.stateDir = filepath.Join(root, "kubelet")
	for _, d := range []string{r.registryDir, r.pluginsDir, r.cdiDir, r.stateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// The driver reaches the API server the way verify does: the same
	// configuration, written as a file.
	raw, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(kubeconfigLoading(kc), nil).RawConfig()
	if err == nil && len(raw.Contexts) > 0 {
		r.kubeconfig = filepath.Join(root, "kubeconfig")
		if err := clientcmd.WriteToFile(raw, r.kubeconfig); err != nil {
			return fmt.Errorf("write the driver's kubeconfig: %w", err)
		}
	}
	suffix := rand.String(6)
	r.node = "dpkit-verify-" + suffix
	r.ns = "dpkit-verify-" + suffix
	r.podUID = types.UID("dpkit-verify-pod-" + suffix)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	// The slices' owner: the driver looks the Node up.
	if _, err := r.client.CoreV1().Nodes().Create(cctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: r.node, Labels: map[string]string{"dpkit.io/verify": "true"}}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Node %s on the API server: %w", r.node, err)
	}
	r.nodeCreated = true
	if _, err := r.client.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Namespace %s on the API server: %w", r.ns, err)
	}
	r.nsCreated = true
	if err := r.watchSlices(ctx); err != nil {
		r.log.Debug("Cannot watch ResourceSlices", "err", err)
	}
	if err := r.startKubelet(); err != nil {
		return err
	}
	vals := map[string]string{
		verify.PlaceholderRegistryDir: r.registryDir, verify.PlaceholderPluginsDir: r.pluginsDir,
		verify.PlaceholderCDIDir: r.cdiDir, verify.PlaceholderNodeName: r.node, verify.PlaceholderKubeconfig: r.kubeconfig,
	}
	r.command = verify.ExpandDRAArgs(r.cfg.Command, vals)
	r.env = append(append([]string(nil), r.cfg.Env...),
		verify.EnvRegistryDir+"="+r.registryDir, verify.EnvDRAPluginsDir+"="+r.pluginsDir,
		verify.EnvCDIDir+"="+r.cdiDir, verify.EnvNodeName+"="+r.node)
	if r.kubeconfig != "" {
		r.env = append(r.env, verify.EnvKubeconfig+"="+r.kubeconfig)
	}
	r.proc, err = verify.StartProcess(r.command, r.env)
	return err
}

func kubeconfigLoading(path string) *clientcmd.ClientConfigLoadingRules {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	return rules
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
	if r.client != nil {
		// Not a finding about the driver, but what the user has to
		// remove by hand.
		for _, l := range r.cleanupAPI() {
			r.log.Warn("Cannot remove an object verify --dra created on the API server", "object", l.object, "why", l.why, "remove", l.remove)
		}
	}
	if r.root != "" {
		_ = os.RemoveAll(r.root)
	}
}
