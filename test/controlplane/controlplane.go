// Package controlplane starts a real Kubernetes control plane for tests:
// etcd, kube-apiserver and, when asked, kube-scheduler and
// kube-controller-manager (Kubernetes v1.37.0), on loopback ports, with
// every file under one temporary directory; and, on it, a real node: a
// kubelet on containerd and runc (StartNode, node_linux.go).
//
// The binaries are built from Go modules by hack/build-controlplane.sh into
// ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/controlplane/v1.37.0 (or the
// directory named by DPKIT_CONTROLPLANE_BIN). The apiserver authenticates
// clients by certificates signed by ClientCAFile, authorizes with the Node
// and RBAC authorizers, runs the NodeRestriction admission plugin and has a
// kubelet client certificate, so node endpoints served by a test kubelet
// that trusts ClientCAFile can be reached through it.
//
// Unless Options.ControllerManager is set there is no
// kube-controller-manager, so nothing creates ServiceAccounts; the
// ServiceAccount admission plugin is disabled in every case so pods need
// none. See docs/testing.md.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dpkit/dpkit/internal/repopath"
)

// Version is the Kubernetes version of the control plane binaries.
const Version = "v1.37.0"

// EnvBinDir names the environment variable that overrides where the
// control plane binaries are looked up.
const EnvBinDir = "DPKIT_CONTROLPLANE_BIN"

// EnvKeep, when set to a non-empty value, keeps the control plane's
// directory (logs, certificates, kubeconfigs) after Stop for debugging.
const EnvKeep = "DPKIT_CONTROLPLANE_KEEP"

// BuildScript is the repository-relative script that builds the binaries.
const BuildScript = "hack/build-controlplane.sh"

// Options configure Start. The zero value starts etcd and kube-apiserver.
type Options struct {
	// Scheduler also starts kube-scheduler, so pods get bound to nodes.
	Scheduler bool
	// ControllerManager also starts kube-controller-manager, so
	// DaemonSets, Deployments and the node lifecycle (the not-ready taint,
	// eviction) work: what a real node (StartNode) needs.
	ControllerManager bool
	// BinDir holds kube-apiserver, kube-scheduler and etcd. Empty means
	// $DPKIT_CONTROLPLANE_BIN, then DefaultBinDir().
	BinDir string
	// TempDir is where the control plane's directory is created. Empty
	// means os.TempDir().
	TempDir string
	// StartTimeout bounds how long Start waits for every component to be
	// ready, on top of ctx. Zero means one minute.
	StartTimeout time.Duration
	// SchedulerQPS and SchedulerBurst are kube-scheduler's client rate
	// limit (clientConnection.qps and .burst in its configuration file).
	// Zero keeps the scheduler's defaults, 50 and 100, which cap binding
	// at about 50 pods a second; benchmarks raise them.
	SchedulerQPS   float32
	SchedulerBurst int32
	// APIServerArgs and SchedulerArgs are appended to the flags Start
	// passes; a flag given here overrides the same flag set by Start.
	APIServerArgs         []string
	SchedulerArgs         []string
	ControllerManagerArgs []string
	// Logger receives progress messages. Nil discards them.
	Logger *slog.Logger
}

// ControlPlane is a running control plane. Stop it when done.
type ControlPlane struct {
	// Dir holds every file of this control plane: certificates,
	// kubeconfigs, the etcd data directory and one log per component
	// (etcd.log, kube-apiserver.log, kube-scheduler.log) and kube-scheduler's
	// configuration file, kube-scheduler.yaml.
	Dir string
	// Kubeconfig is the path of a kubeconfig for an administrator
	// (group system:masters).
	Kubeconfig string
	// RESTConfig is the administrator's client configuration.
	RESTConfig *rest.Config
	// Host is the apiserver URL, https://127.0.0.1:PORT.
	Host string
	// ClientCAFile is the CA that signs every client certificate this
	// control plane issues, the apiserver's kubelet client certificate
	// included: a test kubelet uses it as its --client-ca-file.
	ClientCAFile string
	// ServingCAFile is the CA of the apiserver's serving certificate and of
	// certificates made by IssueServingCert.
	ServingCAFile string
	// EtcdURL is the etcd client URL, http://127.0.0.1:PORT.
	EtcdURL string
	// SchedulerURL is kube-scheduler's secure port, https://127.0.0.1:PORT
	// (/healthz, /metrics, /configz), or empty without a scheduler. It
	// authenticates clients with certificates signed by ClientCAFile.
	SchedulerURL string
	// ControllerManagerURL is kube-controller-manager's secure port, or
	// empty without one.
	ControllerManagerURL string
	// Kubectl is the kubectl (v1.37.0) hack/build-controlplane.sh builds
	// beside the control plane, empty when it is not there: the docs'
	// recipes and their tests use it.
	Kubectl string

	client    kubernetes.Interface
	clientCA  *authority
	servingCA *authority
	logger    *slog.Logger
	procs     []*process
	// node is the real node StartNode started, stopped first by Stop.
	node *Node

	mu       sync.Mutex
	stopped  bool
	stopErr  error
	identity int
}

// DefaultBinDir is where hack/build-controlplane.sh puts the binaries when
// DPKIT_CONTROLPLANE_BIN is not set.
func DefaultBinDir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "dpkit", "controlplane", Version)
}

// BinDir returns the directory Start looks in for opts.
func (o Options) binDir() string {
	if o.BinDir != "" {
		return o.BinDir
	}
	if d := os.Getenv(EnvBinDir); d != "" {
		return d
	}
	return DefaultBinDir()
}

// ErrBinariesMissing is wrapped by Start's error when a binary is not
// found; the message says which command builds them.
var ErrBinariesMissing = errors.New("control plane binaries missing")

// Start starts a control plane and waits until it is ready. On error
// nothing it started is left running.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	bins, err := findBinaries(opts)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.TempDir, "dpkit-cp-")
	if err != nil {
		return nil, fmt.Errorf("controlplane: create directory: %w", err)
	}
	cp := &ControlPlane{Dir: dir, logger: logger}
	if k := filepath.Join(opts.binDir(), "kubectl"); isExecutable(k) {
		cp.Kubectl = k
	}
	defer func() {
		if err != nil {
			// Keep the logs the error points at when asked to.
			if stopErr := cp.Stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()
	began := time.Now()
	if err := cp.writeCertificates(); err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	etcdPort, etcdPeerPort, apiPort, schedPort, kcmPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	cp.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	cp.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	etcd, err := cp.start("etcd", bins["etcd"], etcdArgs(dir, etcdPort, etcdPeerPort))
	if err != nil {
		return nil, err
	}
	if err := waitFor(ctx, etcd, func(ctx context.Context) error {
		return httpOK(ctx, http.DefaultClient, cp.EtcdURL+"/health")
	}); err != nil {
		return nil, err
	}

	api, err := cp.start("kube-apiserver", bins["kube-apiserver"], append(cp.apiserverArgs(apiPort), opts.APIServerArgs...))
	if err != nil {
		return nil, err
	}
	if err := cp.writeAdminConfig(); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, api, func(ctx context.Context) error {
		body, err := cp.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, body)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	logger.Info("Kube-apiserver ready", "host", cp.Host, "after", time.Since(began).Round(time.Millisecond))

	if opts.Scheduler {
		kubeconfig, err := cp.KubeconfigFor("system:kube-scheduler")
		if err != nil {
			return nil, err
		}
		config, err := writeSchedulerConfig(dir, kubeconfig, opts)
		if err != nil {
			return nil, err
		}
		sched, err := cp.start("kube-scheduler", bins["kube-scheduler"], append(schedulerArgs(dir, config, kubeconfig, schedPort), opts.SchedulerArgs...))
		if err != nil {
			return nil, err
		}
		cp.SchedulerURL = "https://127.0.0.1:" + strconv.Itoa(schedPort)
		insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		if err := waitFor(ctx, sched, func(ctx context.Context) error {
			return httpOK(ctx, insecure, cp.SchedulerURL+"/healthz")
		}); err != nil {
			return nil, err
		}
	}
	if opts.ControllerManager {
		if err := cp.startControllerManager(ctx, bins["kube-controller-manager"], kcmPort, opts); err != nil {
			return nil, err
		}
	}
	logger.Info("Control plane ready", "dir", dir, "after", time.Since(began).Round(time.Millisecond))
	return cp, nil
}

// Client returns a clientset for the administrator.
func (cp *ControlPlane) Client() kubernetes.Interface { return cp.client }

// PIDs returns the process ids of the components this control plane
// started, by name.
func (cp *ControlPlane) PIDs() map[string]int {
	out := make(map[string]int, len(cp.procs))
	for _, p := range cp.procs {
		out[p.name] = p.pid()
	}
	return out
}

// LogPath returns the log file of a component: "etcd", "kube-apiserver",
// "kube-scheduler" or "kube-controller-manager".
func (cp *ControlPlane) LogPath(component string) string {
	return filepath.Join(cp.Dir, component+".log")
}

// Stop ends every process Start started, by PID (SIGTERM, then SIGKILL after
// ten seconds), in reverse order, and removes Dir unless DPKIT_CONTROLPLANE_KEEP
// is set. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return cp.stopErr
	}
	cp.stopped = true
	var errs []error
	if cp.node != nil {
		if err := cp.node.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(cp.procs) - 1; i >= 0; i-- {
		if err := cp.procs[i].stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if os.Getenv(EnvKeep) != "" {
		cp.logger.Info("Keeping control plane directory", "dir", cp.Dir)
	} else if err := os.RemoveAll(cp.Dir); err != nil {
		errs = append(errs, fmt.Errorf("controlplane: remove %s: %w", cp.Dir, err))
	}
	cp.stopErr = errors.Join(errs...)
	return cp.stopErr
}

// KubeconfigFor writes a kubeconfig whose client certificate names user and
// groups, and returns its path. A node component uses
// KubeconfigFor("system:node:NAME", "system:nodes") to be authorized by the
// Node authorizer and admitted by NodeRestriction.
func (cp *ControlPlane) KubeconfigFor(user string, groups ...string) (string, error) {
	if user == "" {
		return "", errors.New("controlplane: KubeconfigFor: user is empty")
	}
	certPEM, keyPEM, err := cp.clientCA.issue(user, groups, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", fmt.Errorf("controlplane: %w", err)
	}
	cp.mu.Lock()
	cp.identity++
	n := cp.identity
	cp.mu.Unlock()
	path := filepath.Join(cp.Dir, "kubeconfig", fmt.Sprintf("%02d-%s.kubeconfig", n, fileSafe(user)))
	if err := writeKubeconfig(path, cp.Host, cp.servingCA.certPEM, user, certPEM, keyPEM); err != nil {
		return "", fmt.Errorf("controlplane: kubeconfig for %s: %w", user, err)
	}
	return path, nil
}

// RESTConfigFor is KubeconfigFor returning a client configuration.
func (cp *ControlPlane) RESTConfigFor(user string, groups ...string) (*rest.Config, error) {
	path, err := cp.KubeconfigFor(user, groups...)
	if err != nil {
		return nil, err
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// IssueClientCert writes a client certificate and key for user and groups,
// signed by ClientCAFile, into Dir and returns their paths.
func (cp *ControlPlane) IssueClientCert(user string, groups ...string) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := cp.clientCA.issue(user, groups, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	return cp.writePair("client-"+fileSafe(user), certPEM, keyPEM)
}

// IssueServingCert writes a serving certificate for hosts (IP addresses or
// DNS names), signed by ServingCAFile, into Dir and returns its paths. A test
// kubelet can serve its API with it.
func (cp *ControlPlane) IssueServingCert(name string, hosts ...string) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := cp.servingCA.issue(name, nil, hosts, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	return cp.writePair("serving-"+fileSafe(name), certPEM, keyPEM)
}

func (cp *ControlPlane) writePair(base string, certPEM, keyPEM []byte) (string, string, error) {
	cp.mu.Lock()
	cp.identity++
	n := cp.identity
	cp.mu.Unlock()
	dir := filepath.Join(cp.Dir, "pki", "issued")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	certFile := filepath.Join(dir, fmt.Sprintf("%02d-%s.crt", n, base))
	keyFile := filepath.Join(dir, fmt.Sprintf("%02d-%s.key", n, base))
	if err := writeKeyPair(certFile, keyFile, certPEM, keyPEM); err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	return certFile, keyFile, nil
}

func (cp *ControlPlane) start(name, path string, args []string) (*process, error) {
	p, err := startProcess(name, path, cp.LogPath(name), args)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp.procs = append(cp.procs, p)
	cp.logger.Info("Started", "component", name, "pid", p.pid(), "log", p.logPath)
	return p, nil
}

func (cp *ControlPlane) pki(name string) string { return filepath.Join(cp.Dir, "pki", name) }

// writeCertificates makes the two CAs and every certificate the components
// need.
func (cp *ControlPlane) writeCertificates() error {
	if err := os.MkdirAll(filepath.Join(cp.Dir, "pki"), 0o755); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	var err error
	if cp.clientCA, err = newAuthority("dpkit-test-client-ca"); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if cp.servingCA, err = newAuthority("dpkit-test-serving-ca"); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	cp.ClientCAFile = cp.pki("client-ca.crt")
	cp.ServingCAFile = cp.pki("serving-ca.crt")
	if err := os.WriteFile(cp.ClientCAFile, cp.clientCA.certPEM, 0o644); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if err := os.WriteFile(cp.ServingCAFile, cp.servingCA.certPEM, 0o644); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	certPEM, keyPEM, err := cp.servingCA.issue("kube-apiserver", nil,
		[]string{"127.0.0.1", "::1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if err := writeKeyPair(cp.pki("apiserver.crt"), cp.pki("apiserver.key"), certPEM, keyPEM); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	certPEM, keyPEM, err = cp.clientCA.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if err := writeKeyPair(cp.pki("apiserver-kubelet-client.crt"), cp.pki("apiserver-kubelet-client.key"), certPEM, keyPEM); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	saKey, err := newServiceAccountKey()
	if err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if err := os.WriteFile(cp.pki("service-account.key"), saKey, 0o600); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	return nil
}

func (cp *ControlPlane) writeAdminConfig() error {
	certPEM, keyPEM, err := cp.clientCA.issue("dpkit-admin", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.Host, cp.servingCA.certPEM, "dpkit-admin", certPEM, keyPEM); err != nil {
		return fmt.Errorf("controlplane: admin kubeconfig: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return fmt.Errorf("controlplane: load admin kubeconfig: %w", err)
	}
	// Tests create objects in bursts; the client-side default of 5 QPS
	// only slows them down against a private apiserver.
	cfg.QPS, cfg.Burst = 100, 200
	cp.RESTConfig = cfg
	if cp.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("controlplane: admin client: %w", err)
	}
	return nil
}

func (cp *ControlPlane) apiserverArgs(port int) []string {
	return []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--etcd-prefix=/registry",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--tls-cert-file=" + cp.pki("apiserver.crt"),
		"--tls-private-key-file=" + cp.pki("apiserver.key"),
		"--client-ca-file=" + cp.ClientCAFile,
		"--kubelet-client-certificate=" + cp.pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + cp.pki("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// Without kube-controller-manager no ServiceAccount is ever
		// created; pods must not need one.
		"--disable-admission-plugins=ServiceAccount",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + cp.pki("service-account.key"),
		"--service-account-signing-key-file=" + cp.pki("service-account.key"),
		"--api-audiences=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
}

func etcdArgs(dir string, port, peerPort int) []string {
	client := "http://127.0.0.1:" + strconv.Itoa(port)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	return []string{
		"--name=dpkit",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=dpkit=" + peer,
		// Test data need not survive a power cut; fsync dominates
		// apiserver latency on shared disks.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
}

// writeSchedulerConfig writes kube-scheduler's configuration file,
// Dir/kube-scheduler.yaml, and returns its path. With --config the
// scheduler ignores its deprecated flags (--kubeconfig, --kube-api-qps,
// --kube-api-burst), so the client connection is set here.
func writeSchedulerConfig(dir, kubeconfig string, opts Options) (string, error) {
	var b strings.Builder
	b.WriteString("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
	b.WriteString("clientConnection:\n  kubeconfig: " + strconv.Quote(kubeconfig) + "\n")
	if opts.SchedulerQPS != 0 {
		b.WriteString("  qps: " + strconv.FormatFloat(float64(opts.SchedulerQPS), 'g', -1, 32) + "\n")
	}
	if opts.SchedulerBurst != 0 {
		b.WriteString("  burst: " + strconv.Itoa(int(opts.SchedulerBurst)) + "\n")
	}
	b.WriteString("leaderElection:\n  leaderElect: false\n")
	path := filepath.Join(dir, "kube-scheduler.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("controlplane: kube-scheduler configuration: %w", err)
	}
	return path, nil
}

func schedulerArgs(dir, config, kubeconfig string, port int) []string {
	return []string{
		"--config=" + config,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "scheduler-certs"),
		"--v=1",
	}
}

// startControllerManager starts kube-controller-manager as kubeadm does:
// its own identity for leader-free startup and one service account per
// controller (--use-service-account-credentials), so each controller has
// exactly the permissions of its system:controller:* role.
func (cp *ControlPlane) startControllerManager(ctx context.Context, bin string, port int, opts Options) error {
	kubeconfig, err := cp.KubeconfigFor("system:kube-controller-manager")
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(cp.Dir, "controller-manager-certs"),
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + cp.pki("service-account.key"),
		"--root-ca-file=" + cp.ServingCAFile,
		"--profiling=false",
		"--v=1",
	}
	kcm, err := cp.start("kube-controller-manager", bin, append(args, opts.ControllerManagerArgs...))
	if err != nil {
		return err
	}
	cp.ControllerManagerURL = "https://127.0.0.1:" + strconv.Itoa(port)
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return waitFor(ctx, kcm, func(ctx context.Context) error {
		return httpOK(ctx, insecure, cp.ControllerManagerURL+"/healthz")
	})
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// findBinaries returns the path of each binary, or an error naming the
// command that builds them.
func findBinaries(opts Options) (map[string]string, error) {
	dir := opts.binDir()
	names := []string{"etcd", "kube-apiserver"}
	if opts.Scheduler {
		names = append(names, "kube-scheduler")
	}
	if opts.ControllerManager {
		names = append(names, "kube-controller-manager")
	}
	out := map[string]string{}
	var missing []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, n)
			continue
		}
		out[n] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("controlplane: %w: %s not found in %s; build them with: %s",
			ErrBinariesMissing, strings.Join(missing, ", "), dir, buildCommand(opts))
	}
	return out, nil
}

// buildCommand is the shell command that puts the binaries where opts looks.
func buildCommand(opts Options) string {
	cmd := "bash " + repopath.Find(BuildScript)
	if dir := opts.binDir(); dir != DefaultBinDir() {
		cmd = EnvBinDir + "=" + dir + " " + cmd
	}
	return cmd
}

// freePorts returns n distinct loopback ports that were free a moment ago:
// each is found by listening on port 0, and all are held until every one is
// chosen so none repeats.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("controlplane: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitFor polls ready every 100ms until it succeeds, ctx ends or p exits;
// errors carry p's log tail.
func waitFor(ctx context.Context, p *process, ready func(context.Context) error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("controlplane: %w", p.failure(fmt.Errorf("exited before it was ready: %w", err)))
		}
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = ready(attempt)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("controlplane: %w", p.failure(fmt.Errorf("not ready (%w): %w", last, ctx.Err())))
		case <-p.done:
		case <-tick.C:
		}
	}
}

func httpOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func writeKubeconfig(path, host string, caPEM []byte, user string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dpkit-test"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["dpkit-test"] = &clientcmdapi.Context{Cluster: "dpkit-test", AuthInfo: user}
	cfg.CurrentContext = "dpkit-test"
	return clientcmd.WriteToFile(*cfg, path)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func fileSafe(s string) string { return unsafeChars.ReplaceAllString(s, "_") }
