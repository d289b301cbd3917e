// Package node implements "dpkit node": one or more virtual nodes
// (pkg/virtualnode) registered with a real API server, with device plugins
// registering under --root and pods run by the process or sim backend. What
// it runs is internal/noderun.
package node

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/cri"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/process"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// NewCommand returns the "node" command.
func NewCommand(env *cli.Env) *cobra.Command {
	o := noderun.Options{}
	cmd := &cobra.Command{
		Use:   "node --name NAME --root DIR [--kubeconfig FILE] [--backend process|sim|cri]",
		Short: "Run a virtual node: registers with the API server, embeds a device manager and runs pods",
		Long: `Run a virtual node on virtual-kubelet. The node registers with the API server,
keeps a Lease, and embeds dpkit's device manager: device plugins register at
<root>/device-plugins/kubelet.sock (or through <root>/plugins_registry) and
their resources appear in the node's capacity and allocatable. Pods bound to
the node get their devices at admission and are run by the backend:

  process  each container's command and args run as a host process with the
           pod's environment plus the device plugins' and what its CDI
           devices' specs set (--cdi-spec-dir) (no image, no isolation)
  sim      nothing runs; pods go Pending -> Running (-> Succeeded) on timings
  cri      pods run as containers through a container runtime's CRI API
           (--cri-endpoint): sandbox, images present or pulled, the device
           plugins' device nodes, mounts and CDI devices

The kubelet API (logs, exec, /pods, /stats/summary) is served on --port over
TLS with webhook authentication and authorization; the PodResources API on
<root>/pod-resources/kubelet.sock.

The node registers with the taint dpkit.io/virtual-node:NoSchedule unless
--taint says otherwise; pods that should run there tolerate it:
  tolerations: [{key: dpkit.io/virtual-node, operator: Exists, effect: NoSchedule}]

With --count N, N nodes NAME-0..NAME-(N-1) run in this process sharing
informers, each under <root>/NAME-i on port --port+i. With --plugin-config
FILE, each node also serves that dpkit plugin config in this process, on
its own device-plugins directory (device plugin front only): a thousand
nodes with devices, and no thousand plugin processes.

The API server is reached with --kubeconfig, else $KUBECONFIG, else
~/.kube/config, else the in-cluster configuration inside a pod.`,
		Example: `  dpkit node --kubeconfig k.conf --name vn1 --root /var/lib/dpkit/vn1 --backend process --client-ca-file ca.crt
  dpkit plugin --config examples/fake.yaml --plugin-dir /var/lib/dpkit/vn1/device-plugins
  dpkit node --kubeconfig k.conf --name vn2 --root /var/lib/dpkit/vn2 --backend cri --cri-endpoint unix:///run/containerd/containerd.sock
  dpkit node --kubeconfig k.conf --name sim --count 10 --root /tmp/sim --backend sim --port 11250
  dpkit node --kubeconfig k.conf --name scale --count 1000 --root /tmp/scale --backend sim --port -1 --plugin-config examples/fake.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return cli.Exit(2, err)
			}
			return noderun.Run(cmd.Context(), env.Logger, o, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&o.Name, "name", "", "node name (required)")
	f.StringVar(&o.Root, "root", "", "node root directory: device-plugins/, plugins_registry/, pod-resources/, checkpoint and pod state (required)")
	f.StringVar(&o.Backend, "backend", "process", "pod backend: process (host processes), sim (nothing runs) or cri (containers through --cri-endpoint)")
	f.StringVar(&o.CRIEndpoint, "cri-endpoint", "", "cri backend: the container runtime's CRI socket, e.g. unix:///run/containerd/containerd.sock")
	f.StringSliceVar(&o.ClusterDNS, "cluster-dns", nil, "cri backend: DNS server IPs of ClusterFirst pods, comma-separated (the kubelet's --cluster-dns); without, they use --resolv-conf")
	f.StringVar(&o.CgroupRoot, "cgroup-root", "", "cri backend: cgroupfs path below which each pod's sandbox and containers go, in pod<UID> (the kubelet's --cgroup-root); the runtime then measures each pod whole. Empty: the runtime's default cgroups")
	f.StringVar(&o.ClusterDomain, "cluster-domain", "", "cri backend: the cluster's DNS domain, e.g. cluster.local, searched by ClusterFirst pods")
	f.StringVar(&o.ResolvConf, "resolv-conf", podruntime.DefaultResolvConf, "cri backend: the resolver configuration that pods with dnsPolicy Default use and ClusterFirst pods' search path extends")
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
	f.StringVar(&o.PluginConfig, "plugin-config", "", "a dpkit plugin config (e.g. examples/fake.yaml) served in this process for every node, on its own directories (both fronts; the dra front publishes for its node): N nodes with devices and no N plugin processes")
	f.StringVar(&o.PluginRegistration, "plugin-registration", "", "how --plugin-config's plugins reach their nodes: socket (each serves its socket in its node's plugins_registry, as a DaemonSet's plugin) or in-process (no socket: the same calls, made in this process); default socket for one node, in-process with --count above 1")
	f.IntVar(&o.PodSyncWorkers, "pod-sync-workers", 0, "workers of each of the three pod queues (sync, delete, status), which the nodes of a --count above 1 share; 0: 10 for one node, 2 a node up to 64 with --count above 1 (sim backend: 1 a node, up to 32)")
	f.Float64Var(&o.QPS, "qps", 50, "API client queries per second, shared by all nodes; TokenReviews and SubjectAccessReviews each have a limiter of their own at this rate, Lease renewals and node status updates are not throttled")
	f.IntVar(&o.Burst, "burst", 100, "API client burst (and the review limiters')")
	f.DurationVar(&o.SimStart, "sim-start-delay", 0, "sim backend: how long pods stay Pending before running")
	f.DurationVar(&o.SimRun, "sim-run-duration", 0, "sim backend: how long containers run before exiting 0 (0: until deleted)")
	f.DurationVar(&o.SyncFrequency, "sync-frequency", cri.DefaultVolumeResync, "cri backend: how often ConfigMap, Secret, downward API and token volumes are written again (the kubelet's --sync-frequency)")
	f.DurationVar(&o.BackoffStart, "restart-backoff", process.DefaultBackoffInitial, "process and cri backends: first restart back-off (doubles up to 5m)")
	o.LogMaxSize = *resource.NewQuantity(process.DefaultContainerLogMaxSize, resource.BinarySI)
	f.Var(&quantityFlag{&o.LogMaxSize}, "container-log-max-size", "process backend: rotate a container's log file at this size (like the kubelet's containerLogMaxSize)")
	f.StringSliceVar(&o.CDISpecDirs, "cdi-spec-dir", []string{"/etc/cdi", "/var/run/cdi"}, "process backend: where the CDI specs of containers' CDI devices are read, for the environment they give (repeat, or comma-separate; a runtime's cdi_spec_dirs)")
	f.IntVar(&o.LogMaxFiles, "container-log-max-files", process.DefaultContainerLogMaxFiles, "process backend: log files kept per container, the current one included (at least 2)")
	f.DurationVar(&o.DeviceGracePeriod, "device-grace-period", devicemanager.DefaultGracePeriod, "how long a resource whose device plugins are all gone keeps its capacity (with 0 allocatable) before it drops to 0; the kubelet's is 5m")
	f.StringVar(&o.InotifyLimit, "inotify-limit", noderun.InotifyCheck, "what to do when fs.inotify.max_user_watches cannot hold --count nodes (the nodes share one inotify instance and add 1 watch each): check (refuse, naming the sysctl), raise (raise it, then run; needs root, privileged in a container) or raise-only (raise it and exit: a privileged init container's step)")
	f.DurationVar(&o.DeviceAdmissionWait, "device-admission-wait", 0, "hold a pod asking for a device-plugin resource the node knows (from its checkpoint after a restart) until the resource's plugin serves it again, up to this long, instead of failing it with UnexpectedAdmissionError as the kubelet does (0: the kubelet's behaviour)")
	return cmd
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
