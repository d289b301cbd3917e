package draverify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpkit/dpkit/pkg/verify"
)

// Cleanup removes what runs of dpkit verify --dra that ended without
// cleaning up (killed, the machine stopped) left: their objects on the
// API server (RunLabel), their temporary roots, and the processes of
// their drivers. A run that goes on (its verify process runs) is left
// alone; so is one of another host, which this host cannot tell from one
// that goes on. api is the API server's client configuration. The error
// is non-nil only when nothing could be looked at.
func Cleanup(ctx context.Context, api *rest.Config, cfg verify.DRACleanupConfig) (*verify.DRACleanupReport, error) {
	if api == nil {
		return nil, errors.New("no API server client configuration given")
	}
	if cfg.TempDir == "" {
		cfg.TempDir = os.TempDir()
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = verify.DefaultCallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &orphans{cfg: cfg, processes: runProcesses, connect: func() (*sweeper, error) { return connect(api, cfg) }}
	return c.run(ctx)
}

// connect is a sweeper of the API server of cfg.
func connect(api *rest.Config, cfg verify.DRACleanupConfig) (*sweeper, error) {
	rc := clientConfig(api)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	content, err := newAPIContent(rc)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return &sweeper{client: client, content: content, log: cfg.Logger, timeout: cfg.CallTimeout, controllerWait: namespaceControllerWait}, nil
}

func (c *orphans) run(ctx context.Context) (*verify.DRACleanupReport, error) {
	c.rep, c.state, c.records = &verify.DRACleanupReport{}, map[string]liveness{}, map[string]runRecord{}
	c.readRoots()
	// First the drivers, so that none publishes again what is deleted.
	c.killDrivers()
	if err := c.sweepAPI(ctx); err != nil {
		if len(c.roots) == 0 && len(c.rep.Leftovers) == 0 {
			return c.rep, err
		}
		c.add("", "the API server", verify.LeftoverFailed, err.Error()+"; the runs' objects there are left (label "+RunLabel+")")
	}
	c.removeRoots()
	sort.SliceStable(c.rep.Leftovers, func(i, j int) bool { return c.rep.Leftovers[i].Run < c.rep.Leftovers[j].Run })
	return c.rep, nil
}

// orphans is one clean-up.
type orphans struct {
	cfg verify.DRACleanupConfig
	// processes lists the processes with a run in their environment;
	// connect reaches the API server.
	processes func() []runProcess
	connect   func() (*sweeper, error)

	rep *verify.DRACleanupReport
	// roots are the runs' temporary roots by run, records their records.
	roots   map[string]string
	records map[string]runRecord
	// state is what is known of each run's owner.
	state map[string]liveness
	// failed are the runs of which something could not be removed.
	failed map[string]bool
	// reported are the runs reported kept.
	reported map[string]bool
}

func (c *orphans) add(run, object, action, detail string) {
	c.rep.Leftovers = append(c.rep.Leftovers, verify.DRALeftover{Run: run, Object: object, Action: action, Detail: detail})
	if action == verify.LeftoverFailed {
		if c.failed == nil {
			c.failed = map[string]bool{}
		}
		c.failed[run] = true
	}
}

// kept reports a run left alone, once.
func (c *orphans) kept(run string, o owner, object string) {
	if c.reported[run] {
		return
	}
	if c.reported == nil {
		c.reported = map[string]bool{}
	}
	c.reported[run] = true
	switch c.state[run] {
	case ownerRuns:
		c.add(run, object, verify.LeftoverKept, "its run goes on ("+o.String()+")")
	case ownerUnknown:
		c.add(run, object, verify.LeftoverKept, "its run is of host "+o.Host+", which cannot be told from here; run dpkit verify --dra --cleanup there, or delete it by hand once the run is over")
	}
}

// readRoots reads the run records of the temporary roots.
func (c *orphans) readRoots() {
	c.roots = map[string]string{}
	dirs, _ := filepath.Glob(filepath.Join(c.cfg.TempDir, rootPattern))
	for _, dir := range dirs {
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue
		}
		rec, err := readRecord(dir)
		if errors.Is(err, fs.ErrNotExist) {
			// A run of an older dpkit, or one in the moment before it
			// writes its record.
			c.add("", "directory "+dir, verify.LeftoverKept, "no run record ("+recordFile+"): not a run of this dpkit's verify --dra; remove it by hand if it is one that ended")
			continue
		}
		if err != nil {
			c.add("", "directory "+dir, verify.LeftoverKept, err.Error())
			continue
		}
		c.roots[rec.Run], c.records[rec.Run] = dir, rec
		c.state[rec.Run] = rec.Owner.alive()
		if c.state[rec.Run] != ownerGone {
			c.kept(rec.Run, rec.Owner, "directory "+dir)
		}
	}
}

// killDrivers kills the processes of runs that have ended: those with
// the run in their environment. What ended is told by the run's record,
// else by the owner in the process's environment.
func (c *orphans) killDrivers() {
	for _, p := range c.processes() {
		object := fmt.Sprintf("process %d (%s)", p.pid, p.name)
		st, known := c.state[p.run]
		switch {
		case known && st != ownerGone:
			continue
		case !known && !p.hasOwner:
			c.add(p.run, object, verify.LeftoverKept, "no record of its run and no "+envOwner+" in its environment: verify cannot tell whether its run goes on; kill -9 "+strconv.Itoa(p.pid)+" if it is left")
			continue
		case !known && p.owner.alive() != ownerGone:
			continue
		}
		if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			c.add(p.run, object, verify.LeftoverFailed, err.Error()+"; kill -9 "+strconv.Itoa(p.pid))
			continue
		}
		c.add(p.run, object, verify.LeftoverKilled, "")
	}
}

// sweepAPI removes the objects of the runs that have ended.
func (c *orphans) sweepAPI(ctx context.Context) error {
	s, err := c.connect()
	if err != nil {
		return err
	}
	runs, err := c.runsOnAPI(ctx, s)
	if err != nil {
		return err
	}
	for _, run := range runs {
		if st, ok := c.state[run.id]; ok && st != ownerGone {
			c.kept(run.id, run.owner, run.object)
			continue
		}
		if _, ok := c.state[run.id]; !ok {
			c.state[run.id] = ownerGone
			if run.hasOwner {
				if c.state[run.id] = run.owner.alive(); c.state[run.id] != ownerGone {
					c.kept(run.id, run.owner, run.object)
					continue
				}
			}
		}
		var uids []types.UID
		if rec, ok := c.records[run.id]; ok && rec.NodeUID != "" {
			uids = append(uids, rec.NodeUID)
		}
		s.removed = func(object string) { c.add(run.id, object, verify.LeftoverRemoved, "") }
		for _, l := range s.sweep(run.id, uids...) {
			c.add(run.id, l.object, verify.LeftoverFailed, l.why+"; remove: "+l.remove)
		}
	}
	return nil
}

// apiRun is a run found on the API server.
type apiRun struct {
	id       string
	owner    owner
	hasOwner bool
	object   string // an object of it, for the report
}

// runsOnAPI finds the runs with objects on the API server, by RunLabel,
// and their owners from the annotations of their Namespaces and Nodes.
func (c *orphans) runsOnAPI(ctx context.Context, s *sweeper) ([]apiRun, error) {
	byID := map[string]*apiRun{}
	note := func(o metav1.Object, kind string) {
		id := o.GetLabels()[RunLabel]
		if id == "" {
			return
		}
		r := byID[id]
		if r == nil {
			r = &apiRun{id: id, object: kind + " " + o.GetName()}
			byID[id] = r
		}
		if a, ok := o.GetAnnotations()[ownerAnnotation]; ok && !r.hasOwner {
			r.hasOwner = json.Unmarshal([]byte(a), &r.owner) == nil
		}
	}
	opts := metav1.ListOptions{LabelSelector: RunLabel}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	nss, err := s.client.CoreV1().Namespaces().List(cctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list the runs' Namespaces: %w", err)
	}
	for i := range nss.Items {
		note(&nss.Items[i], "Namespace")
	}
	nodes, err := s.client.CoreV1().Nodes().List(cctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list the runs' Nodes: %w", err)
	}
	for i := range nodes.Items {
		note(&nodes.Items[i], "Node")
	}
	for _, k := range s.accessKinds() {
		objs, err := k.list(cctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list the runs' %ss: %w", k.name, err)
		}
		for _, o := range objs {
			note(o, k.name)
		}
	}
	claims, err := s.client.ResourceV1().ResourceClaims("").List(cctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list the runs' ResourceClaims: %w", err)
	}
	for i := range claims.Items {
		note(&claims.Items[i], "ResourceClaim")
	}
	out := make([]apiRun, 0, len(byID))
	for _, r := range byID {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b apiRun) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// removeRoots removes the roots of the runs that have ended, but of one
// whose objects could not all be removed: its record tells a later
// clean-up its Node.
func (c *orphans) removeRoots() {
	for run, dir := range c.roots {
		if c.state[run] != ownerGone || c.failed[run] {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			c.add(run, "directory "+dir, verify.LeftoverFailed, err.Error())
			continue
		}
		c.add(run, "directory "+dir, verify.LeftoverRemoved, "")
	}
}
