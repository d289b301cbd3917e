package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// TestVirtualNodeSecretsRedacted runs a pod whose containers get Secrets'
// values through env (secretKeyRef, and a literal $(VAR) that expands to
// one) and envFrom. Neither the node API's /pods nor the pod's state.json
// (mode 0600) holds those values, before and after a restart of the node;
// the container that starts after the restart still gets them.
func TestVirtualNodeSecretsRedacted(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-secret")
	port, access := freePort(t), newNodeAccess(t, cp)
	_, stop := startStoppableNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, access.ip, port)
	ns := createNamespace(t, c, "vn-secret")

	secret := func() string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return "s3cret-" + hex.EncodeToString(b)
	}
	token, password := secret(), secret()
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": token, "PASSWORD": password},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hold) })
	fromSecret := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": name},
			Tolerations:   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			// The init container holds the pod until the test removes
			// hold, which it does while the node is down: the app
			// container starts after the restart.
			InitContainers: []corev1.Container{{
				Name: "wait", Image: "none",
				Command: []string{"sh", "-c", fmt.Sprintf("while [ -e %s ]; do sleep 0.1; done", hold)},
				Env:     []corev1.EnvVar{{Name: "TOK", ValueFrom: fromSecret}},
			}},
			Containers: []corev1.Container{{
				Name: "app", Image: "none",
				Command: []string{"sh", "-c", `printf %s "$TOK/$PASSWORD/$X" | sha256sum`},
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}}},
				Env:     []corev1.EnvVar{{Name: "TOK", ValueFrom: fromSecret}, {Name: "X", Value: "x$(TOK)"}},
			}},
		},
	}
	created, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, pod.Name, "with its init container running", func(p *corev1.Pod) bool {
		st := p.Status.InitContainerStatuses
		return len(st) == 1 && st[0].State.Running != nil
	})

	state := filepath.Join(root, "pods", string(created.UID), "state.json")
	noSecrets := func(when string) {
		t.Helper()
		var served string
		poll(t, ctx, "the node API to list the pod", func(ctx context.Context) (bool, string, error) {
			b, err := access.get(ctx, c, name, port, "pods")
			if err != nil {
				return false, err.Error(), nil
			}
			served = string(b)
			return strings.Contains(served, created.Name) && strings.Contains(served, string(created.UID)), "", nil
		})
		stored, err := os.ReadFile(state)
		if err != nil {
			t.Fatal(err)
		}
		for what, text := range map[string]string{"GET /pods": served, "state.json": string(stored)} {
			for _, v := range []string{token, password} {
				if strings.Contains(text, v) {
					t.Errorf("%s: %s holds a Secret's value", when, what)
				}
			}
			// The references are there: the pod as the API server has it.
			if !strings.Contains(text, `"secretKeyRef"`) || !strings.Contains(text, `"x$(TOK)"`) {
				t.Errorf("%s: %s does not show the pod's env as the API server has it", when, what)
			}
		}
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: state.json has mode %v, want 0600", when, fi.Mode().Perm())
		}
	}
	noSecrets("while the init container runs")

	stop()
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	startStoppableNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, access.ip, port)
	waitPod(t, ctx, c, ns, pod.Name, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	sum := sha256.Sum256([]byte(token + "/" + password + "/x" + token))
	waitLogs(t, ctx, c, ns, pod.Name, hex.EncodeToString(sum[:]))
	noSecrets("after a restart")
}
