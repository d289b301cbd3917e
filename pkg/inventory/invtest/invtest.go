// Package invtest runs an inventory (pkg/inventory) for a plugin's tests:
// the ledger, the DRA view and the device plugin front over the plugin's
// own Scan, without a kubelet.
package invtest

import (
	"context"
	"testing"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// Run runs an inventory of p's devices for resource until the test ends,
// and returns it once the plugin's Scan has reported its devices.
func Run(t testing.TB, resource string, p deviceplugin.Plugin, opts ...inventory.Option) *inventory.Inventory {
	t.Helper()
	inv := inventory.New(resource, p, nil, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = inv.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	ch, stop := inv.Watch()
	defer stop()
	for {
		if _, known := inv.Devices(); known {
			return inv
		}
		select {
		case <-ch:
		case <-done:
			t.Fatalf("the inventory of %s stopped before the plugin reported its devices", resource)
		}
	}
}
