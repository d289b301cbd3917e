package drafront

import (
	"testing"

	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/draplugin"
)

// TestCheckpointName: pluginrun looks for a retired driver's claims
// where the driver writes its checkpoint.
func TestCheckpointName(t *testing.T) {
	if pluginrun.DRACheckpointFile != draplugin.CheckpointFile {
		t.Fatalf("pluginrun.DRACheckpointFile = %q, draplugin.CheckpointFile = %q", pluginrun.DRACheckpointFile, draplugin.CheckpointFile)
	}
}
