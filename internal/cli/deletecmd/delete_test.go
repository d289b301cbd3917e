package deletecmd

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/testdir"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelete(t *testing.T) {
	root := testdir.Short(t, "kd")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- emulator.Run(ctx, emulator.Options{Root: root}, func(*emulator.Emulator) { close(started) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet: %v", err)
		}
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("kubelet: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("kubelet did not start")
	}
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	if _, err := c.AdmitPod(ctx, []byte("metadata: {name: web, namespace: shop}\nspec: {containers: [{name: nginx}]}\n")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		args     []string
		exit     int
		contains string
	}{
		{[]string{"pod", "web", "--root", root}, 1, `pod web in namespace default not found`},
		{[]string{"pod", "web", "-n", "shop", "--root", root}, 0, `pod "web" deleted from namespace "shop"`},
		{[]string{"pod", "web", "-n", "shop", "--root", root}, 1, `pod web in namespace shop not found`},
		{[]string{"node", "web", "--root", root}, 2, "only pods"},
	}
	for _, tc := range tests {
		var out bytes.Buffer
		env := &cli.Env{Out: &out, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
		cmd := NewCommand(env)
		cmd.SetArgs(tc.args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.ExecuteContext(ctx)
		if code := cli.ExitCode(err); code != tc.exit {
			t.Errorf("delete %v: exit %d (%v), want %d", tc.args, code, err, tc.exit)
		}
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.contains) {
			t.Errorf("delete %v: %q does not contain %q", tc.args, got, tc.contains)
		}
	}
	if pods, err := c.Pods(ctx); err != nil || len(pods) != 0 {
		t.Errorf("pods after delete: %+v, %v", pods, err)
	}
}

// TestDeleteKubectlHabits checks -f, several names, -o json, usage errors,
// $DPKIT_ROOT and the completion of pod names.
func TestDeleteKubectlHabits(t *testing.T) {
	root := testdir.Short(t, "kd")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- emulator.Run(ctx, emulator.Options{Root: root}, func(*emulator.Emulator) { close(started) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet: %v", err)
		}
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("kubelet: %v", err)
	}
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	admit := func(ns, name string) {
		t.Helper()
		if _, err := c.AdmitPod(ctx, []byte("metadata: {name: "+name+", namespace: "+ns+"}\nspec: {containers: [{name: c}]}\n")); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"a", "b", "c10", "c2"} {
		admit("default", n)
	}
	admit("ml", "train")
	manifest := filepath.Join(t.TempDir(), "train.yaml")
	if err := os.WriteFile(manifest, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: train, namespace: ml}\nspec: {containers: [{name: c}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{emulator.RootEnv: root}

	// Completion lists the namespace's pods in natural order, but those
	// already named.
	var comp bytes.Buffer
	parent := &cobra.Command{Use: "dpkit"}
	parent.AddCommand(NewCommand(&cli.Env{Out: io.Discard, Err: io.Discard, Logger: slog.New(slog.DiscardHandler), Getenv: func(k string) string { return vars[k] }}))
	parent.SetArgs([]string{cobra.ShellCompRequestCmd, "delete", "pod", "b", ""})
	parent.SetOut(&comp)
	parent.SetErr(io.Discard)
	if err := parent.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(comp.String())[:3], []string{"a", "c2", "c10"}; !slices.Equal(got, want) {
		t.Errorf("completion %q, want %q first", comp.String(), want)
	}

	for _, tc := range []struct {
		args  []string
		stdin string
		exit  int
		want  string // regular expression the output or error matches
	}{
		{nil, "", 2, `name the pods to delete`},
		{[]string{"pod"}, "", 2, `name the pods to delete: dpkit delete pod NAME \[NAME \.\.\.\]`},
		{[]string{"pod", "a", "-f", manifest}, "", 2, `give pod names or -f, not both`},
		{[]string{"-f", manifest, "-n", "default"}, "", 2, `the pod's namespace "ml" does not match --namespace "default"`},
		{[]string{"-f", "nope.yaml"}, "", 2, `-f nope\.yaml: the file does not exist`},
		{[]string{"-f", "-"}, "metadata: {name: x}\n", 2, `spec\.containers: Required`},
		{[]string{"pod", "a", "-o", "wide"}, "", 2, `"wide" is not a format; use table, json or yaml`},
		{[]string{"-f", manifest, "-o", "json"}, "", 0, `(?s)^\[\n  \{\n    "namespace": "ml",\n    "name": "train",.*\]\n$`},
		{[]string{"pod", "a", "nope", "c2"}, "", 1, `^pod nope in namespace default not found\n\(root .*, from \$DPKIT_ROOT; --root chooses another\)$`},
		{[]string{"pods", "b", "-o", "yaml"}, "", 0, `^- containers:\n  - name: c\n    type: app\n  name: b\n  namespace: default\n  uid: `},
	} {
		var out bytes.Buffer
		env := &cli.Env{In: strings.NewReader(tc.stdin), Out: &out, Err: io.Discard, Logger: slog.New(slog.DiscardHandler), Getenv: func(k string) string { return vars[k] }}
		cmd := NewCommand(env)
		cmd.SetArgs(tc.args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.ExecuteContext(ctx)
		if code := cli.ExitCode(err); code != tc.exit {
			t.Errorf("delete %v: exit %d (%v), want %d", tc.args, code, err, tc.exit)
			continue
		}
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !regexp.MustCompile(tc.want).MatchString(got) {
			t.Errorf("delete %v: %q does not match %s", tc.args, got, tc.want)
		}
	}
	// "delete pod a nope c2" deleted a and c2 all the same.
	pods, err := c.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pods {
		left = append(left, p.Namespace+"/"+p.Name)
	}
	if want := []string{"default/c10"}; !slices.Equal(left, want) {
		t.Errorf("pods left %q, want %q", left, want)
	}
}
