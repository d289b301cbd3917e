package verifyproc_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/verifyproc"
)

func TestExitDescription(t *testing.T) {
	t.Parallel()
	wait := func(script string) error { return exec.Command("sh", "-c", script).Run() }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "exited with status 0"},
		{wait("exit 3"), "exited with status 3"},
		{wait("kill -9 $$"), "was killed by signal 9 (killed)"},
		{errors.New("wait: no child"), "ended: wait: no child"},
	} {
		if got := verifyproc.ExitDescription(tc.err); got != tc.want {
			t.Errorf("verifyproc.ExitDescription(%v) = %q, want %q", tc.err, got, tc.want)
		}
		if strings.Contains(verifyproc.ExitDescription(tc.err), "<nil>") {
			t.Errorf("verifyproc.ExitDescription(%v) mentions <nil>", tc.err)
		}
	}
}
