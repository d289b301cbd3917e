package draplugin_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/draplugin"
)

// offered runs the device plugin front's Scan and returns a function that
// waits until it offers exactly ids.
func offered(t *testing.T, front deviceplugin.Plugin) func(what string, ids ...string) {
	t.Helper()
	lists := make(chan []string, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = front.Scan(ctx, func(devs []deviceplugin.Device) {
			var ids []string
			for _, d := range devs {
				ids = append(ids, d.ID)
			}
			slices.Sort(ids)
			select {
			case lists <- ids:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var last []string
	return func(what string, ids ...string) {
		t.Helper()
		slices.Sort(ids)
		for !slices.Equal(last, ids) {
			select {
			case last = <-lists:
			case <-t.Context().Done():
				return
			case <-time.After(dratest.EventTimeout):
				t.Fatalf("%s: the device plugin front offers %v, want %v", what, last, ids)
			}
		}
	}
}

// TestReserveAllocated: with both fronts (Config.Allocated), a claim the
// scheduler allocated leaves the device plugin front's list before any
// Prepare, and the front's Allocate of its device is refused naming the
// claim; the claim then prepares. A claim allocated a device the device
// plugin front took first does not take it, and its Prepare fails as
// without Allocated. Deallocated, a claim that was never prepared gives
// its device back.
func TestReserveAllocated(t *testing.T) {
	n := newNode(t)
	n.allocated = draplugin.NewAllocatedClaims(n.client, nil)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1", "dev-2"))
	n.waitRegistered(t)
	front := d.inv.DevicePluginFront()
	want := offered(t, front)
	want("before any claim", "dev-0", "dev-1", "dev-2")

	ctx := context.Background()
	a := n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	want("claim a allocated dev-0", "dev-1", "dev-2")
	_, err := front.Allocate(ctx, []string{"dev-0"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ResourceClaim default/a (uid-a)") {
		t.Fatalf("Allocate of an allocated claim's device: %v, want FailedPrecondition naming claim a", err)
	}
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p1", "pod-1", "a")); err != nil {
		t.Fatalf("Prepare of the allocated claim: %v", err)
	}

	// The device plugin front takes dev-1 before claim b is allocated it.
	if _, err := front.Allocate(ctx, []string{"dev-1"}); err != nil {
		t.Fatal(err)
	}
	n.add(t, "default", "b", "uid-b", []types.UID{"pod-2"}, "dev-1")
	// Claim c, allocated dev-2 and never prepared, shows b was seen too.
	c := n.add(t, "default", "c", "uid-c", []types.UID{"pod-3"}, "dev-2")
	want("claims b and c allocated; dev-1 stays the device plugin front's", "dev-1")
	err = n.m.PrepareResources(ctx, dratest.Pod("default", "p2", "pod-2", "b"))
	if err == nil || !strings.Contains(err.Error(), `"dev-1" is held by device plugin container`) {
		t.Fatalf("Prepare of a claim whose device the device plugin front took first: %v, want refused naming the container", err)
	}

	// Claim c deallocated (its pod deleted before it reached the node):
	// dev-2 is offered again. Claim a, prepared, keeps dev-0 when it is
	// deallocated before its Unprepare.
	c.Status.Allocation, c.Status.ReservedFor = nil, nil
	n.put(t, c)
	a.Status.Allocation, a.Status.ReservedFor = nil, nil
	n.put(t, a)
	if err := n.client.ResourceV1().ResourceClaims("default").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("claim c deallocated", "dev-1", "dev-2")
	if _, err := front.Allocate(ctx, []string{"dev-0"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate of a prepared claim's device after its deallocation: %v, want FailedPrecondition", err)
	}
	if err := n.m.UnprepareResources(ctx, dratest.Pod("default", "p1", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	want("claim a unprepared", "dev-0", "dev-1", "dev-2")

	// Unprepared while still allocated (the claim controller has not
	// deallocated it yet): the kubelet is done with it, and its device
	// is free again, as a driver's Unprepare frees it.
	n.add(t, "default", "d", "uid-d", []types.UID{"pod-4"}, "dev-2")
	want("claim d allocated dev-2", "dev-0", "dev-1")
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p4", "pod-4", "d")); err != nil {
		t.Fatal(err)
	}
	if err := n.m.UnprepareResources(ctx, dratest.Pod("default", "p4", "pod-4", "d")); err != nil {
		t.Fatal(err)
	}
	want("claim d unprepared, still allocated", "dev-0", "dev-1", "dev-2")
	if _, err := front.Allocate(ctx, []string{"dev-2"}); err != nil {
		t.Fatalf("Allocate of an unprepared claim's device: %v", err)
	}
}

// TestReserveAllocatedRefused: a front refused list and watch of
// ResourceClaims says so once, naming the fix, and the driver goes on
// preparing claims, holding their devices from Prepare on.
func TestReserveAllocatedRefused(t *testing.T) {
	n := newNode(t)
	n.client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resourcev1.Resource("resourceclaims"), "", errors.New("RBAC: not allowed"))
	})
	logs := make(records, 64)
	n.allocated = draplugin.NewAllocatedClaims(n.client, slog.New(logs))
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	for {
		select {
		case l := <-logs:
			if !strings.Contains(l, "Cannot list and watch ResourceClaims") {
				continue
			}
			if !strings.Contains(l, "list and watch of resource.k8s.io resourceclaims") {
				t.Fatalf("the refusal's log names no fix: %s", l)
			}
		case <-time.After(dratest.EventTimeout):
			t.Fatal("no warning that ResourceClaims cannot be listed")
		}
		break
	}
	want := offered(t, d.inv.DevicePluginFront())
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	want("a claim allocated, not followed", "dev-0", "dev-1")
	if err := n.m.PrepareResources(context.Background(), dratest.Pod("default", "p1", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	want("the claim prepared", "dev-1")
}
