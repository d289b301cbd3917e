// Package node implements "dpkit node": one or more virtual nodes
// (pkg/virtualnode) registered with a real API server, with device plugins
// registering under --root and pods run by the process or sim backend.
package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/process"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// Options are the command's flags.
type Options struct {
	Kubeconfig   string
	Name         string
	Root         string
	Backend      string
	ClientCAFile string
	TLSCertFile  string
	TLSKeyFile   string
	Port         int
	NodeIP       string
	Taints       []string
	CPU, Memory  string
	Pods         string
	Resources    []string
	Count        int
	QPS          float64
	Burst        int
	SimStart     time.Duration
	SimRun       time.Duration
	BackoffStart time.Duration
	// LogMaxSize and LogMaxFiles rotate the process backend's container
	// logs, like the kubelet's containerLogMaxSize and containerLogMaxFiles.
	LogMaxSize  resource.Quantity
	LogMaxFiles int
	// DeviceGracePeriod is how long a resource whose device plugins are
	// all gone keeps its capacity; 0 means the kubelet's 5m.
	DeviceGracePeriod time.Duration
}

// NewCommand returns the "node" command.
func NewCommand(env *cli.Env) *cobra.Command {
	o := Options{}
	cmd := &cobra.Command{
		Use:   "node --name NAME --root DIR [--kubeconfig FILE] [--backend process|sim]",
		Short: "Run a virtual node: registers with the API server, embeds a device manager and runs pods",
		Long: `Run a virtual node on virtual-kubelet. The node registers with the API server,
keeps a Lease, and embeds dpkit's device manager: device plugins register at
<root>/device-plugins/kubelet.sock (or through <root>/plugins_registry) and
their resources appear in the node's capacity and allocatable. Pods bound to
the node get their devices at admission and are run by the backend:

  process  each container's command and args run as a host process with the
           pod's environment plus the device plugins' (no image, no isolation)
  sim      nothing runs; pods go Pending -> Running (-> Succeeded) on timings

The kubelet API (logs, exec, /pods, /stats/summary) is served on --port over
TLS with webhook authentication and authorization; the PodResources API on
<root>/pod-resources/kubelet.sock.

The node registers with the taint dpkit.io/virtual-node:NoSchedule unless
--taint says otherwise; pods that should run there tolerate it:
  tolerations: [{key: dpkit.io/virtual-node, operator: Exists, effect: NoSchedule}]

With --count N, N nodes NAME-0..NAME-(N-1) run in this process sharing
informers, each under <root>/NAME-i on port --port+i.`,
		Example: `  dpkit node --kubeconfig k.conf --name vn1 --root /var/lib/dpkit/vn1 --backend process --client-ca-file ca.crt
  dpkit plugin --config examples/fake.yaml --plugin-dir /var/lib/dpkit/vn1/device-plugins
  dpkit node --kubeconfig k.conf --name sim --count 10 --root /tmp/sim --backend sim --port 11250`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return cli.Exit(2, err)
			}
			return Run(cmd.Context(), env, o, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&o.Name, "name", "", "node name (required)")
	f.StringVar(&o.Root, "root", "", "node root directory: device-plugins/, plugins_registry/, pod-resources/, checkpoint and pod state (required)")
	f.StringVar(&o.Backend, "backend", "process", "pod backend: process or sim")
	f.StringVar(&o.ClientCAFile, "client-ca-file", "", "CA that signs client certificates accepted by the node API (the API server's kubelet client certificate)")
	f.StringVar(&o.TLSCertFile, "tls-cert-file", "", "node API serving certificate (default: self-signed)")
	f.StringVar(&o.TLSKeyFile, "tls-private-key-file", "", "node API serving key")
	f.IntVar(&o.Port, "port", virtualnode.DefaultPort, "node API port (the kubelet port); -1 disables it")
	f.StringVar(&o.NodeIP, "node-ip", "", "the node's InternalIP, where the API server reaches the node API (default: the address of the interface with the default route, else 127.0.0.1)")
	f.StringSliceVar(&o.Taints, "taint", []string{virtualnode.DefaultTaintKey + ":NoSchedule"}, "taints to register with, key[=value]:Effect; --taint='' registers none")
	f.StringVar(&o.CPU, "cpu", "8", "declared cpu capacity")
	f.StringVar(&o.Memory, "memory", "32Gi", "declared memory capacity")
	f.StringVar(&o.Pods, "pods", "110", "declared pod capacity")
	f.StringArrayVar(&o.Resources, "resource", nil, "declared extended resource NAME=QUANTITY (repeatable); device-plugin resources are added automatically")
	f.IntVar(&o.Count, "count", 1, "number of virtual nodes to run in this process")
	f.Float64Var(&o.QPS, "qps", 50, "API client queries per second, shared by all nodes; TokenReviews and SubjectAccessReviews each have a limiter of their own at this rate, Lease renewals and node status updates are not throttled")
	f.IntVar(&o.Burst, "burst", 100, "API client burst (and the review limiters')")
	f.DurationVar(&o.SimStart, "sim-start-delay", 0, "sim backend: how long pods stay Pending before running")
	f.DurationVar(&o.SimRun, "sim-run-duration", 0, "sim backend: how long containers run before exiting 0 (0: until deleted)")
	f.DurationVar(&o.BackoffStart, "restart-backoff", process.DefaultBackoffInitial, "process backend: first restart back-off (doubles up to 5m)")
	o.LogMaxSize = *resource.NewQuantity(process.DefaultContainerLogMaxSize, resource.BinarySI)
	f.Var(&quantityFlag{&o.LogMaxSize}, "container-log-max-size", "process backend: rotate a container's log file at this size (like the kubelet's containerLogMaxSize)")
	f.IntVar(&o.LogMaxFiles, "container-log-max-files", process.DefaultContainerLogMaxFiles, "process backend: log files kept per container, the current one included (at least 2)")
	f.DurationVar(&o.DeviceGracePeriod, "device-grace-period", devicemanager.DefaultGracePeriod, "how long a resource whose device plugins are all gone keeps its capacity (with 0 allocatable) before it drops to 0; the kubelet's is 5m")
	return cmd
}

func (o *Options) validate() error {
	var errs field.ErrorList
	if o.Name == "" {
		errs = append(errs, field.Required(field.NewPath("--name"), "name the node"))
	}
	if o.Root == "" {
		errs = append(errs, field.Required(field.NewPath("--root"), "give the node's root directory"))
	}
	if o.Backend != "process" && o.Backend != "sim" {
		errs = append(errs, field.NotSupported(field.NewPath("--backend"), o.Backend, []string{"process", "sim"}))
	}
	if o.DeviceGracePeriod < 0 {
		errs = append(errs, field.Invalid(field.NewPath("--device-grace-period"), o.DeviceGracePeriod.String(), "must not be negative"))
	}
	if o.Count < 1 {
		errs = append(errs, field.Invalid(field.NewPath("--count"), o.Count, "must be at least 1"))
	}
	if o.QPS <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("--qps"), o.QPS, "must be positive"))
	}
	if o.Burst < 1 {
		errs = append(errs, field.Invalid(field.NewPath("--burst"), o.Burst, "must be at least 1"))
	}
	if _, err := o.resources(); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("--resource"), o.Resources, err.Error()))
	}
	if _, err := ParseTaints(o.Taints); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("--taint"), o.Taints, err.Error()))
	}
	return errs.ToAggregate()
}

func (o *Options) resources() (corev1.ResourceList, error) {
	rl := corev1.ResourceList{}
	var errs []error
	add := func(name, q string) {
		v, err := resource.ParseQuantity(q)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, q, err))
			return
		}
		rl[corev1.ResourceName(name)] = v
	}
	add("cpu", o.CPU)
	add("memory", o.Memory)
	add("pods", o.Pods)
	for _, r := range o.Resources {
		name, q, ok := strings.Cut(r, "=")
		if !ok || name == "" {
			errs = append(errs, fmt.Errorf("%q: want NAME=QUANTITY", r))
			continue
		}
		add(name, q)
	}
	return rl, errors.Join(errs...)
}

// ParseTaints parses key[=value]:Effect taints; an empty string is
// skipped.
func ParseTaints(specs []string) ([]corev1.Taint, error) {
	out := []corev1.Taint{}
	var errs []error
	for _, s := range specs {
		if s == "" {
			continue
		}
		kv, effect, ok := strings.Cut(s, ":")
		if !ok {
			errs = append(errs, fmt.Errorf("%q: want key[=value]:Effect", s))
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		e := corev1.TaintEffect(effect)
		if e != corev1.TaintEffectNoSchedule && e != corev1.TaintEffectPreferNoSchedule && e != corev1.TaintEffectNoExecute {
			errs = append(errs, fmt.Errorf("%q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s))
			continue
		}
		if k == "" {
			errs = append(errs, fmt.Errorf("%q: empty key", s))
			continue
		}
		out = append(out, corev1.Taint{Key: k, Value: v, Effect: e})
	}
	return out, errors.Join(errs...)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// Run runs the nodes until ctx is done. started, when not nil, is called
// once every node runs.
func Run(ctx context.Context, env *cli.Env, o Options, started func([]*virtualnode.Node)) error {
	rc, err := restConfig(o.Kubeconfig)
	if err != nil {
		return cli.Exit(2, fmt.Errorf("API client: %w", err))
	}
	rc.UserAgent = "dpkit-node"
	clients, err := virtualnode.NewClients(rc, float32(o.QPS), o.Burst)
	if err != nil {
		return cli.Exit(2, err)
	}
	client := clients.Client
	res, _ := o.resources()
	taints, _ := ParseTaints(o.Taints)
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return err
	}
	var newBackend virtualnode.NewBackend
	switch o.Backend {
	case "sim":
		newBackend = func(_, _ string, c backend.Config) (backend.Backend, error) {
			return sim.New(sim.Config{Config: c, StartDelay: o.SimStart, RunDuration: o.SimRun}), nil
		}
	default:
		newBackend = func(_, root string, c backend.Config) (backend.Backend, error) {
			return process.New(process.Config{Config: c, Dir: filepath.Join(root, "pods"), BackoffInitial: o.BackoffStart,
				ContainerLogMaxSize: o.LogMaxSize.Value(), ContainerLogMaxFiles: o.LogMaxFiles})
		}
	}
	var shared informers.SharedInformerFactory
	if o.Count > 1 {
		shared = informers.NewSharedInformerFactory(client, 0)
		defer shared.Shutdown()
	}
	var (
		mu    sync.Mutex
		nodes []*virtualnode.Node
	)
	g, gctx := errgroup.WithContext(ctx)
	for i := range o.Count {
		cfg := virtualnode.Config{
			Name:         o.Name,
			Root:         root,
			Client:       client,
			Informers:    shared,
			NewBackend:   newBackend,
			Resources:    res,
			Taints:       taints,
			NodeIP:       o.NodeIP,
			Port:         o.Port,
			ClientCAFile: o.ClientCAFile,
			TLSCertFile:  o.TLSCertFile,
			TLSKeyFile:   o.TLSKeyFile,
			Logger:       env.Logger,

			DeviceGracePeriod: o.DeviceGracePeriod,
		}
		cfg.HeartbeatClient = clients.Heartbeat
		cfg.TokenReviewClient, cfg.SubjectAccessReviewClient = clients.TokenReviews, clients.SubjectAccessReviews
		if o.Count > 1 {
			cfg.Name = o.Name + "-" + strconv.Itoa(i)
			cfg.Root = filepath.Join(root, cfg.Name)
			if o.Port > 0 {
				cfg.Port = o.Port + i
			}
		}
		g.Go(func() error {
			return virtualnode.Run(gctx, cfg, func(n *virtualnode.Node) {
				mu.Lock()
				nodes = append(nodes, n)
				all := len(nodes) == o.Count
				mu.Unlock()
				if all && started != nil {
					started(nodes)
				}
			})
		})
	}
	return g.Wait()
}

// quantityFlag is a pflag.Value for a resource.Quantity ("10Mi").
type quantityFlag struct{ q *resource.Quantity }

func (f *quantityFlag) String() string { return f.q.String() }
func (f *quantityFlag) Type() string   { return "quantity" }
func (f *quantityFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a size such as 10Mi: %w", s, err)
	}
	if q.Sign() <= 0 {
		return fmt.Errorf("%q: the size must be positive", s)
	}
	*f.q = q
	return nil
}
