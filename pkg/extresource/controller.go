package extresource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dpkit/dpkit/pkg/configfile"
)

// ControllerConfig configures NewController.
type ControllerConfig struct {
	// Client needs get, list and watch on nodes and patch on nodes/status.
	Client kubernetes.Interface
	// NodeName is the node to keep the resources on.
	NodeName string
	// File is a resources file (see ExtendedResources). When set, the
	// controller loads it at start and follows its changes; a change that
	// does not load is logged and the last good content stays in force.
	File string
	// Resources is the desired state when File is empty.
	Resources *ExtendedResources
	// Overrides are set on top of the file's resources (flags override the
	// file).
	Overrides corev1.ResourceList
	// RemoveOnExit removes every resource the controller set when Run's
	// context ends.
	RemoveOnExit bool
	// Logger receives what the controller does. Nil discards.
	Logger *slog.Logger
}

// Controller keeps a declared set of extended resources on one node: it
// watches the node and re-applies the set whenever the node's status drifts
// from it, and follows a resources file when one is given. Resources dropped
// from the file are removed from the node.
type Controller struct {
	cfg    ControllerConfig
	logger *slog.Logger // with the node
	base   *slog.Logger // for the advertiser, which adds the node itself

	spec    *ExtendedResources
	managed map[corev1.ResourceName]bool
}

// NewController validates cfg and returns a controller; Run starts it.
func NewController(cfg ControllerConfig) (*Controller, error) {
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("config.Client is nil: set the API server client"))
	}
	if cfg.NodeName == "" {
		errs = append(errs, errors.New("NodeName is empty: give the node to advertise on"))
	}
	if cfg.File == "" && cfg.Resources == nil && len(cfg.Overrides) == 0 {
		errs = append(errs, errors.New("no resources: give File, Resources or Overrides"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("extresource: ControllerConfig: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, logger: logger.With("node", cfg.NodeName), base: logger, managed: map[corev1.ResourceName]bool{}}, nil
}

// load returns the desired state: the file (or cfg.Resources) with the
// overrides on top, defaulted and validated.
func (c *Controller) load() (*ExtendedResources, error) {
	var spec *ExtendedResources
	if c.cfg.File != "" {
		er, err := Load(c.cfg.File)
		if err != nil {
			return nil, err
		}
		spec = er
	} else if c.cfg.Resources != nil {
		cp := *c.cfg.Resources
		cp.Resources = append([]Resource(nil), c.cfg.Resources.Resources...)
		spec = &cp
	} else {
		spec = &ExtendedResources{TypeMeta: configfile.TypeMeta{APIVersion: configfile.APIVersion, Kind: Kind}}
	}
	for _, n := range sortedNames(c.cfg.Overrides) {
		q := c.cfg.Overrides[n]
		replaced := false
		for i := range spec.Resources {
			if spec.Resources[i].Name == n {
				spec.Resources[i].Quantity = &q
				replaced = true
			}
		}
		if !replaced {
			spec.Resources = append(spec.Resources, Resource{Name: n, Quantity: &q})
		}
	}
	spec.Default()
	if err := configfile.Join(spec.Validate()); err != nil {
		return nil, err
	}
	return spec, nil
}

// Run keeps the resources on the node until ctx ends. It returns an error
// when the starting configuration is invalid, the node cache cannot sync,
// or removal on exit fails; a cancelled ctx is a normal end.
func (c *Controller) Run(ctx context.Context) error {
	spec, err := c.load()
	if err != nil {
		return err
	}
	c.spec = spec

	reload := make(chan struct{}, 1)
	if c.cfg.File != "" {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			return fmt.Errorf("watch %s: %w", c.cfg.File, err)
		}
		defer w.Close()
		// Watch the directory: editors and ConfigMap volumes replace the
		// file (rename, ..data symlink swap) rather than write it.
		if err := w.Add(filepath.Dir(c.cfg.File)); err != nil {
			return fmt.Errorf("watch %s: %w", c.cfg.File, err)
		}
		go c.watchFile(ctx, w, reload)
	}

	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(c.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.cfg.NodeName).String()
		}))
	nodes := factory.Core().V1().Nodes()
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("watch node %s: %w", c.cfg.NodeName, err)
	}
	lister := nodes.Lister()
	watchCtx, stopWatch := context.WithCancel(ctx)
	factory.Start(watchCtx.Done())
	defer func() {
		stopWatch()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return c.exit(ctx, fmt.Errorf("node %s: cache did not sync: %w", c.cfg.NodeName, ctx.Err()))
	}
	c.logger.Info("Advertising extended resources", "resources", formatList(c.spec.List()), "file", c.cfg.File)

	retry := time.NewTimer(0)
	<-retry.C
	backoff := time.Duration(0)
	resync := newTicker(c.spec.ResyncPeriod.Duration)
	defer resync.stop()
	poke()
	for {
		select {
		case <-ctx.Done():
			return c.exit(ctx, nil)
		case <-reload:
			spec, err := c.load()
			if err != nil {
				c.logger.Error("Resources file not applied; keeping the previous resources", "file", c.cfg.File, "err", err)
				continue
			}
			c.logger.Info("Resources file changed", "file", c.cfg.File, "resources", formatList(spec.List()))
			c.spec = spec
			resync.reset(spec.ResyncPeriod.Duration)
			poke()
			continue
		case <-kick:
		case <-retry.C:
		case <-resync.c():
		}
		if err := c.reconcile(ctx, lister.Get); err != nil {
			if ctx.Err() != nil {
				continue
			}
			backoff = min(max(2*backoff, time.Second), time.Minute)
			c.logger.Error("Could not update node; retrying", "err", err, "in", backoff)
			retry.Reset(backoff)
			continue
		}
		backoff = 0
	}
}

// reconcile brings the node to the desired state. The cached node decides
// whether anything is to be done; the patch itself is computed on a fresh
// read.
func (c *Controller) reconcile(ctx context.Context, get func(string) (*corev1.Node, error)) error {
	node, err := get(c.cfg.NodeName)
	if apierrors.IsNotFound(err) {
		c.logger.Info("Node not found; waiting for it")
		return nil
	}
	if err != nil {
		return err
	}
	want := c.spec.List()
	var remove []corev1.ResourceName
	for n := range c.managed {
		if _, ok := want[n]; !ok {
			remove = append(remove, n)
		}
	}
	if patch, _ := Diff(node, want, remove, *c.spec.Allocatable); len(patch) == 0 {
		c.setManaged(want)
		return nil
	}
	adv, err := NewAdvertiser(AdvertiserConfig{Client: c.cfg.Client, SkipAllocatable: !*c.spec.Allocatable, Logger: c.base})
	if err != nil {
		return err
	}
	if _, err := adv.Apply(ctx, c.cfg.NodeName, want, remove); err != nil {
		return err
	}
	c.setManaged(want)
	return nil
}

func (c *Controller) setManaged(l corev1.ResourceList) {
	c.managed = make(map[corev1.ResourceName]bool, len(l))
	for n := range l {
		c.managed[n] = true
	}
}

// exit removes the resources when asked to, with a fresh deadline since
// ctx has ended.
func (c *Controller) exit(ctx context.Context, cause error) error {
	if !c.cfg.RemoveOnExit {
		return cause
	}
	names := map[corev1.ResourceName]bool{}
	for n := range c.managed {
		names[n] = true
	}
	if c.spec != nil {
		for n := range c.spec.List() {
			names[n] = true
		}
	}
	remove := make([]corev1.ResourceName, 0, len(names))
	for n := range names {
		remove = append(remove, n)
	}
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	adv, err := NewAdvertiser(AdvertiserConfig{Client: c.cfg.Client, Logger: c.base})
	if err != nil {
		return errors.Join(cause, err)
	}
	if _, err := adv.Apply(cleanup, c.cfg.NodeName, nil, remove); err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(cause, fmt.Errorf("remove extended resources on exit: %w", err))
	}
	c.logger.Info("Removed extended resources on exit", "resources", remove)
	return cause
}

// watchFile turns file events into (debounced) reloads until ctx ends.
func (c *Controller) watchFile(ctx context.Context, w *fsnotify.Watcher, reload chan<- struct{}) {
	base := filepath.Base(c.cfg.File)
	debounce := time.NewTimer(0)
	<-debounce.C
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if name := filepath.Base(ev.Name); name == base || name == "..data" {
				// Writers often truncate, then write: wait for quiet.
				debounce.Reset(100 * time.Millisecond)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			c.logger.Error("Watching resources file", "file", c.cfg.File, "err", err)
		case <-debounce.C:
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}
}

// ticker is a time.Ticker that can be off (period 0).
type ticker struct{ t *time.Ticker }

func newTicker(d time.Duration) *ticker {
	t := &ticker{}
	t.reset(d)
	return t
}

func (t *ticker) reset(d time.Duration) {
	t.stop()
	if d > 0 {
		t.t = time.NewTicker(d)
	}
}

func (t *ticker) stop() {
	if t.t != nil {
		t.t.Stop()
		t.t = nil
	}
}

func (t *ticker) c() <-chan time.Time {
	if t.t == nil {
		return nil
	}
	return t.t.C
}
