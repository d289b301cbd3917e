// Package pluginrun runs the device plugins a PluginConfig describes, with
// their metrics and probes: what "dpkit plugin" and "dpkit up" run.
package pluginrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/probes"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Started is told the server and the probe address (empty when off) once
// both are set up, before registration.
type Started func(srv *deviceplugin.Server, metricsAddr string)

// ErrNoDRAFront is CheckFronts' error: this build serves resources only
// through the device plugin API.
var ErrNoDRAFront = errors.New("the DRA front is not available in this build of dpkit")

// CheckFronts returns an error wrapping ErrNoDRAFront, naming the entries
// and the fix, when cfg asks for a front Run cannot serve. It is the one
// place that says which fronts this build serves.
func CheckFronts(cfg *config.PluginConfig) error {
	var entries []string
	for i, p := range cfg.Plugins {
		if slices.Contains(p.Fronts, config.FrontDRA) {
			entries = append(entries, fmt.Sprintf("plugins[%d].fronts", i))
		}
	}
	if len(entries) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w; remove dra from fronts to serve the resources through the device plugin API (dpkit deviceclass prints the DeviceClasses of the config as it is)", strings.Join(entries, ", "), ErrNoDRAFront)
}

// Run serves cfg's plugins until ctx ends, with metrics and probes on
// cfg.MetricsAddress when set. started may be nil; log may be nil.
func Run(ctx context.Context, log *slog.Logger, cfg *config.PluginConfig, started Started) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckFronts(cfg); err != nil {
		return err
	}
	opts := cfg.HostOptions()
	opts.Logger = log
	resources, err := cfg.Resources(opts)
	if err != nil {
		return err
	}
	var reg *prometheus.Registry
	if cfg.MetricsAddress != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	dpCfg := deviceplugin.Config{
		PluginDir:    cfg.PluginDir,
		Registration: deviceplugin.RegistrationMode(cfg.Registration),
		RegistryDir:  cfg.RegistryDir,
		Logger:       log,
	}
	if reg != nil {
		dpCfg.Registerer = reg
	}
	srv, err := deviceplugin.NewServer(dpCfg, resources...)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	addr := ""
	if reg != nil {
		ps, err := probes.Listen(cfg.MetricsAddress, reg, srv.Ready, log)
		if err != nil {
			return err
		}
		addr = ps.Addr()
		log.Info("Serving metrics and probes", "address", addr)
		g.Go(func() error { return ps.Serve(ctx) })
	}
	if started != nil {
		started(srv, addr)
	}
	g.Go(func() error { return srv.Run(ctx) })
	return g.Wait()
}
