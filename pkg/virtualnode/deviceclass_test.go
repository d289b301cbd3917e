package virtualnode

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestWarnServedBothWays: a device-plugin resource that a DeviceClass
// maps to DRA (explicitly by extendedResourceName, or the implicit
// deviceclass.resource.kubernetes.io/<class>) gets a warning naming the
// resource and the DeviceClass, once, when the name first registers; a
// name no DeviceClass maps gets none.
func TestWarnServedBothWays(t *testing.T) {
	t.Parallel()
	name := "example.com/both"
	client := fake.NewClientset(
		&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: resourcev1.DeviceClassSpec{ExtendedResourceName: &name}},
		&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "implicit"}},
	)
	var buf bytes.Buffer
	n := &Node{cfg: Config{Client: client}, log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx := context.Background()

	n.warnServedBothWays(ctx, n.newPluginNames(map[string]int64{"example.com/alone": 1}))
	if buf.Len() != 0 {
		t.Fatalf("warning for a name no DeviceClass maps: %s", buf.String())
	}
	n.warnServedBothWays(ctx, n.newPluginNames(map[string]int64{"example.com/alone": 1, name: 2, "deviceclass.resource.kubernetes.io/implicit": 1}))
	out := buf.String()
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, "resource=deviceclass.resource.kubernetes.io/implicit deviceClass=implicit") ||
		!strings.Contains(out, "resource=example.com/both deviceClass=gpus") {
		t.Fatalf("warnings:\n%s\nwant one for example.com/both naming DeviceClass gpus and one for the implicit name of DeviceClass implicit", buf.String())
	}
	buf.Reset()
	n.warnServedBothWays(ctx, n.newPluginNames(map[string]int64{name: 2}))
	if buf.Len() != 0 {
		t.Fatalf("second warning for a name already checked: %s", buf.String())
	}
}

// TestDeviceClassesShared: nodes that share a DeviceClasses are answered
// by one List while it is fresh, and each still warns about its own
// names.
func TestDeviceClassesShared(t *testing.T) {
	t.Parallel()
	name := "example.com/both"
	client := fake.NewClientset(&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: resourcev1.DeviceClassSpec{ExtendedResourceName: &name}})
	classes := NewDeviceClasses(client)
	ctx := context.Background()
	for i := range 3 {
		var buf bytes.Buffer
		n := &Node{cfg: Config{Client: client, DeviceClasses: classes}, log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		n.warnServedBothWays(ctx, n.newPluginNames(map[string]int64{name: 1}))
		if !strings.Contains(buf.String(), "resource=example.com/both deviceClass=gpus") {
			t.Fatalf("node %d: no warning naming DeviceClass gpus: %q", i, buf.String())
		}
	}
	lists := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "list" && a.GetResource().Resource == "deviceclasses" {
			lists++
		}
	}
	if lists != 1 {
		t.Fatalf("%d Lists of DeviceClasses for 3 nodes sharing one, want 1", lists)
	}
}
