// Package exporter implements "dpkit exporter": Prometheus metrics that
// map the devices a kubelet gave out to the pods holding them, read from
// the PodResources API (pkg/exporter).
package exporter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/httpserve"
	"github.com/dpkit/dpkit/pkg/exporter"
)

// Defaults of the flags.
const (
	defaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	defaultListen = ":9410"
	envNodeName   = "NODE_NAME"
)

// NewCommand returns the "exporter" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var (
		socket, listen, kubeconfig, nodeName, sysfs, draDir string
		podLabels                                           []string
		cacheTTL                                            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exporter",
		Short: "Serve Prometheus metrics of the devices each pod holds, from PodResources",
		Long: `Serve Prometheus metrics on /metrics that map every device a kubelet gave out
to the pod, container and resource holding it: device plugins' devices by
resource and device ID, DRA devices by claim, driver, pool and device, with
the NUMA node; the allocatable and allocated devices of each resource; and
AMD GPUs' use (busy, memory, power, temperature) read from sysfs.

It reads the PodResources API of the kubelet (a real one, dpkit node's or
dpkit kubelet's) at most once per --cache-ttl, however many scrapers ask,
and reconnects when the socket is served again after a restart.

With --kubeconfig it also reads the node's pods from the API server: each
device's health from the pod status (allocatedResourcesStatus), and the pod
labels --pod-label names, as label_<name>. Give --kubeconfig "" for the
usual lookup ($KUBECONFIG, ~/.kube/config, then the pod's service account).
That part runs in dpkit-cluster, which dpkit runs for it.

With --dra-plugins-dir (the kubelet's plugins directory) it reads the
health of DRA devices straight from their drivers' health streams
(<dir>/<driver>/dra.sock), for devices the pod status does not list or
without --kubeconfig. Device plugins' health is not read from the plugins:
a second ListAndWatch stream is not safe for every plugin.`,
		Example: `  dpkit exporter --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
  dpkit exporter --kubeconfig "" --node-name "$NODE_NAME" --pod-label app.kubernetes.io/name
  dpkit exporter --dra-plugins-dir /var/lib/kubelet/plugins
  curl -s localhost:9410/metrics | grep dpkit_pod_device`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			useAPI := cmd.Flags().Changed("kubeconfig")
			if len(podLabels) > 0 && !useAPI {
				return cli.UsageErrorf("--pod-label: pod labels come from the API server; give --kubeconfig too (\"\" for the usual lookup)")
			}
			if socket == "" {
				return cli.UsageErrorf("--pod-resources-socket must not be empty; leave it out for %s", defaultSocket)
			}
			if cacheTTL < 0 {
				return cli.UsageErrorf("--cache-ttl %s: must not be negative", cacheTTL)
			}
			if cmd.Flags().Changed("dra-plugins-dir") {
				if fi, err := os.Stat(draDir); err != nil || !fi.IsDir() {
					return cli.UsageErrorf("--dra-plugins-dir %q: not a directory; give the kubelet's plugins directory (/var/lib/kubelet/plugins), or leave the flag out", draDir)
				}
			}
			cfg := exporter.Config{Socket: socket, CacheTTL: cacheTTL, PodLabels: podLabels, Logger: env.Logger.With("component", "exporter")}
			if sysfs != "" {
				cfg.Collectors = append(cfg.Collectors, exporter.AMDCollector{SysfsRoot: sysfs})
			}
			check := cfg
			if useAPI {
				check.Pods = podSource(nil) // read below, once the rest is known good
			}
			if err := check.Validate(); err != nil {
				return cli.UsageError(err)
			}
			ctx := cmd.Context()
			if useAPI {
				reader, ok := env.Cluster.(cli.NodePodsReader)
				if !ok {
					return errors.New("--kubeconfig needs the API server clients of dpkit-cluster")
				}
				node := cmp.Or(nodeName, env.Var(envNodeName))
				if node == "" {
					return cli.UsageErrorf("--node-name: required with --kubeconfig (default $%s); a DaemonSet sets it from spec.nodeName", envNodeName)
				}
				get, err := reader.NodePods(ctx, kubeconfig, node)
				if err != nil {
					return cli.UsageError(err)
				}
				cfg.Pods = podSource(get)
			}
			return run(ctx, env, cfg, listen, draDir)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "pod-resources-socket", defaultSocket, "PodResources API socket of the kubelet (dpkit node's and dpkit kubelet's: <root>/pod-resources/kubelet.sock)")
	fl.StringVar(&listen, "listen", defaultListen, "address to serve /metrics and /healthz on")
	fl.DurationVar(&cacheTTL, "cache-ttl", exporter.DefaultCacheTTL, "how long one PodResources answer serves scrapes (the kubelet allows 100 requests a second, bursts of 10, for all its clients)")
	fl.StringVar(&kubeconfig, "kubeconfig", "", "read device health and pod labels from the API server with this kubeconfig (\"\": $KUBECONFIG, ~/.kube/config, in-cluster)")
	fl.StringVar(&nodeName, "node-name", "", "the node whose pods to read from the API server (default $"+envNodeName+")")
	fl.StringArrayVar(&podLabels, "pod-label", nil, "a pod label to copy to the device metrics as label_<name> (repeatable; needs --kubeconfig)")
	fl.StringVar(&draDir, "dra-plugins-dir", "", "the kubelet's plugins directory: read DRA devices' health from their drivers' health streams (<dir>/<driver>/dra.sock)")
	fl.StringVar(&sysfs, "sysfs-root", "/sys", "the host's /sys, where AMD GPUs' use is read (\"\" turns that off)")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

func run(ctx context.Context, env *cli.Env, cfg exporter.Config, listen, draDir string) error {
	if draDir != "" {
		h, err := exporter.NewDRAHealth(exporter.DRAHealthConfig{PluginsDir: draDir, Logger: cfg.Logger})
		if err != nil {
			return cli.UsageError(fmt.Errorf("--dra-plugins-dir: %w", err))
		}
		defer func() { _ = h.Close() }()
		cfg.Health = h
	}
	e, err := exporter.New(cfg)
	if err != nil {
		return cli.UsageError(err)
	}
	defer func() { _ = e.Close() }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(e, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return cli.UsageError(fmt.Errorf("--listen %s: %w", listen, err))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	env.Logger.Info("Serving device metrics", "address", l.Addr().String(), "socket", cfg.Socket)
	return httpserve.Serve(ctx, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, l)
}

// podSource is a cli.NodePodsGetter as an exporter.PodSource.
type podSource cli.NodePodsGetter

func (p podSource) Pods(ctx context.Context) (map[exporter.PodKey]exporter.PodInfo, error) {
	pods, err := p(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[exporter.PodKey]exporter.PodInfo, len(pods))
	for k, v := range pods {
		out[exporter.PodKey{Namespace: k[0], Name: k[1]}] = exporter.PodInfo{Labels: v.Labels, Health: v.Health}
	}
	return out, nil
}
