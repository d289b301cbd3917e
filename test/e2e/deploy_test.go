package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/test/controlplane"
)

// EnvRender names a prebuilt hack/render binary; without it the test
// builds one (Helm and kustomize live in that separate module so the main
// module stays lean).
const EnvRender = "DPKIT_RENDER"

var (
	renderOnce sync.Once
	renderBin  string
	renderErr  error
)

func renderer(t *testing.T) string {
	t.Helper()
	renderOnce.Do(func() {
		if p := os.Getenv(EnvRender); p != "" {
			renderBin = p
			return
		}
		dir, err := os.MkdirTemp("", "dpkit-render")
		if err != nil {
			renderErr = err
			return
		}
		renderBin = filepath.Join(dir, "render")
		cmd := exec.Command("go", "build", "-o", renderBin, ".")
		cmd.Dir = filepath.Join("..", "..", "hack", "render")
		if out, err := cmd.CombinedOutput(); err != nil {
			renderErr = fmt.Errorf("build hack/render (set %s to a prebuilt one): %w\n%s", EnvRender, err, out)
		}
	})
	if renderErr != nil {
		t.Fatal(renderErr)
	}
	return renderBin
}

func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(renderer(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render %v: %v\n%s", args, err, stderr.String())
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(&stdout, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("render %v: decode output: %v", args, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) == 0 {
		t.Fatalf("render %v: no objects", args)
	}
	return objs
}

// checkPluginConfigs decodes the config.yaml of every ConfigMap strictly
// into the plugins' Config types, defaults and validates it.
func checkPluginConfigs(t *testing.T, objs []*unstructured.Unstructured) int {
	t.Helper()
	n := 0
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		raw, ok := data["config.yaml"]
		if !ok {
			continue
		}
		n++
		// The file as dpkit plugin reads it: strict decoding, defaults,
		// validation with field paths.
		if _, err := config.DecodePluginConfig([]byte(raw)); err != nil {
			t.Errorf("ConfigMap %s: %v", o.GetName(), err)
		}
	}
	return n
}

// TestDeployDryRun renders every kustomize overlay and the Helm chart and
// applies each object with server-side apply and dryRun=All against a real
// kube-apiserver, so schema, defaulting and admission errors surface.
func TestDeployDryRun(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	dyn, err := dynamic.NewForConfig(cp.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	ctx := context.Background()
	// Namespaced objects can be dry-run only in a namespace that exists.
	for _, ns := range []string{"dpkit-system", "dpkit-sim"} {
		_, err := cp.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	deploy := filepath.Join("..", "..", "deploy")
	cases := []struct {
		name string
		args []string
		// kinds that must be among the rendered objects
		want []string
	}{
		{"kustomize base", []string{"kustomize", filepath.Join(deploy, "base")}, []string{"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service"}},
		{"kustomize generic", []string{"kustomize", filepath.Join(deploy, "overlays", "generic")}, []string{"DaemonSet", "ConfigMap"}},
		{"kustomize amdgpu", []string{"kustomize", filepath.Join(deploy, "overlays", "amdgpu")}, []string{"DaemonSet", "ConfigMap"}},
		{"kustomize nvidia", []string{"kustomize", filepath.Join(deploy, "overlays", "nvidia")}, []string{"DaemonSet", "ConfigMap"}},
		{"kustomize generic-dra", []string{"kustomize", filepath.Join(deploy, "overlays", "generic-dra")}, []string{"DaemonSet", "ConfigMap", "ClusterRole", "ClusterRoleBinding"}},
		{"helm dra", []string{"helm", filepath.Join(deploy, "helm", "dpkit"), "-f", filepath.Join("testdata", "helm-dra.yaml")}, []string{"DaemonSet", "ConfigMap", "ClusterRole", "ClusterRoleBinding"}},
		{"helm all plugins", []string{"helm", filepath.Join(deploy, "helm", "dpkit"), "-f", filepath.Join("testdata", "helm-all-plugins.yaml")}, []string{"DaemonSet", "ConfigMap", "ServiceAccount", "Service"}},
		{"kustomize simulator", []string{"kustomize", filepath.Join(deploy, "simulator")}, []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "StatefulSet", "ConfigMap"}},
		{"kustomize exporter", []string{"kustomize", filepath.Join(deploy, "exporter")}, []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service"}},
		{"helm exporter", []string{"helm", filepath.Join(deploy, "helm", "dpkit"), "-f", filepath.Join("testdata", "helm-exporter.yaml")}, []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.args...)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
			}
			for _, k := range tc.want {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered (got %v)", k, kinds)
				}
			}
			// The exporter's manifests run no plugin.
			if !strings.HasSuffix(tc.name, " exporter") && checkPluginConfigs(t, objs) == 0 {
				t.Error("no plugin config rendered")
			}
			for _, o := range objs {
				applyDryRun(ctx, t, dyn, mapper, o)
				checkPluginRollout(t, o)
			}
		})
	}

	t.Run("helm requires a plugin", func(t *testing.T) {
		cmd := exec.Command(renderer(t), "helm", filepath.Join(deploy, "helm", "dpkit"))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "no plugin enabled") {
			t.Errorf("rendering with no plugin enabled: %v\n%s", err, out)
		}
	})
	t.Run("helm servicemonitor", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("plugins: {nvidia: {enabled: true}}\nserviceMonitor: {enabled: true}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, o := range render(t, "helm", filepath.Join(deploy, "helm", "dpkit"), "-f", values) {
			if o.GetKind() == "ServiceMonitor" && o.GetAPIVersion() == "monitoring.coreos.com/v1" {
				found = true
			}
		}
		if !found {
			t.Error("serviceMonitor.enabled rendered no ServiceMonitor")
		}
	})
	t.Run("exporter servicemonitor", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("exporter: {enabled: true}\nserviceMonitor: {enabled: true}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, args := range map[string][]string{
			"helm":      {"helm", filepath.Join(deploy, "helm", "dpkit"), "-f", values},
			"kustomize": {"kustomize", filepath.Join(deploy, "exporter", "servicemonitor")},
		} {
			found := false
			for _, o := range render(t, args...) {
				if o.GetKind() == "ServiceMonitor" && o.GetName() != "" && strings.HasSuffix(o.GetName(), "exporter") {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no ServiceMonitor for the exporter", name)
			}
		}
	})
	// With only the exporter enabled, the chart renders none of the
	// plugins' objects (their ServiceAccount, metrics Service and
	// ServiceMonitor select pods that do not exist); draHealth gives the
	// exporter the kubelet's plugins directory.
	t.Run("helm exporter alone", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("exporter: {enabled: true, draHealth: true}\nserviceMonitor: {enabled: true}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, o := range render(t, "helm", filepath.Join(deploy, "helm", "dpkit"), "-f", values) {
			if !strings.HasSuffix(o.GetName(), "-exporter") || o.GetLabels()["app.kubernetes.io/name"] == "dpkit-plugin" {
				t.Errorf("exporter alone rendered %s %s (labels %v): not the exporter's", o.GetKind(), o.GetName(), o.GetLabels())
			}
			if o.GetKind() != "DaemonSet" {
				continue
			}
			ctrs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
			mounts, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "volumeMounts")
			if !slices.Contains(args, "--dra-plugins-dir=/var/lib/kubelet/plugins") || !strings.Contains(fmt.Sprint(mounts), "mountPath:/var/lib/kubelet/plugins") {
				t.Errorf("draHealth: exporter args %v, mounts %v; want --dra-plugins-dir and the plugins directory mounted", args, mounts)
			}
		}
	})
}

// checkPluginRollout checks that a plugin's DaemonSet rolls with
// maxSurge 1 and maxUnavailable 0: the new instance registers before the
// old one stops (docs/reliability.md measures what maxUnavailable 1
// costs).
func checkPluginRollout(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	if o.GetKind() != "DaemonSet" || o.GetLabels()["app.kubernetes.io/name"] != "dpkit-plugin" {
		return
	}
	ru, _, _ := unstructured.NestedMap(o.Object, "spec", "updateStrategy", "rollingUpdate")
	if fmt.Sprint(ru["maxSurge"]) != "1" || fmt.Sprint(ru["maxUnavailable"]) != "0" {
		t.Errorf("DaemonSet %s rolls with %v, want maxSurge 1 and maxUnavailable 0", o.GetName(), ru)
	}
}

func applyDryRun(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Errorf("%s %s: no API for it: %v", gvk, o.GetName(), err)
		return
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = "dpkit-system"
		}
		ri = dyn.Resource(m.Resource).Namespace(ns)
	}
	force := true
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
		DryRun: []string{metav1.DryRunAll}, FieldManager: "dpkit-e2e", Force: &force,
	})
	if err != nil {
		t.Errorf("dry-run apply %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
}
