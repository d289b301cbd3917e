package deletecmd

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelete(t *testing.T) {
	root, err := os.MkdirTemp("", "kd")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(root) }()
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
