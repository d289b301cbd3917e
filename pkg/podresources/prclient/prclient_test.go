package prclient_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// A socket nobody serves: Dial gives up when ctx is done, saying which
// socket and how it ended, and leaves no connection behind.
func TestDialTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "missing.sock")
	_, _, err := prclient.Dial(ctx, sock)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial to a missing socket = %v, want a deadline error", err)
	}
	if !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "last state") {
		t.Errorf("error %q does not name the socket and the last state", err)
	}
}
