package dramanager

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

const driverName = dratest.DriverName

// node is a kubelet root with the manager and a plugin watcher on it, and
// a claims directory both the manager and the fake driver read.
type node struct {
	root   string
	claims dratest.Claims
	m      *Manager
	w      *pluginwatcher.Watcher
	cancel context.CancelFunc
}

func newNode(t *testing.T, root string, mod func(*Config)) *node {
	t.Helper()
	return newNodeHooked(t, root, mod, nil)
}

// newNodeHooked is newNode with hook called on the manager before Start,
// to set its test hooks.
func newNodeHooked(t *testing.T, root string, mod func(*Config), hook func(*Manager)) *node {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	n := &node{root: root, claims: dratest.Claims(filepath.Join(root, "claims"))}
	cfg := Config{Root: root, Claims: n.claims}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.m = m
	if hook != nil {
		hook(m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	if err := n.m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      filepath.Join(n.root, "plugins_registry"),
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: n.m.PluginHandler()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n.w = w
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.cancel()
	<-n.w.Done()
	n.m.Stop()
}

func (n *node) startDriver(t *testing.T, args ...string) *dratest.Driver {
	t.Helper()
	return dratest.Start(t, n.root, n.claims, args...)
}

// waitPlugins waits until the manager lists want plugins, all connected.
func (n *node) waitPlugins(t *testing.T, want int) []Plugin {
	t.Helper()
	for {
		ch := n.m.PluginsChanged()
		ps := n.m.Plugins()
		up := 0
		for _, p := range ps {
			if p.Connected {
				up++
			}
		}
		if len(ps) == want && up == want {
			return ps
		}
		<-ch
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }
