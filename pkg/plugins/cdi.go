package plugins

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// CDIVersion is the CDI specification version the plugins write.
const CDIVersion = "0.6.0"

// CDISpecFile returns the name of the spec file a plugin writes for a CDI
// kind (vendor.com/class, or a resource name used as one):
// dpkit-nvidia_com_gpu.json for nvidia.com/gpu.
func CDISpecFile(kind string) string {
	return "dpkit-" + strings.NewReplacer("/", "_", ".", "_").Replace(kind) + ".json"
}

// CDIWriter writes one plugin's CDI spec into Dir as CDISpecFile(kind):
// atomically (the runtime never reads half a spec) and only when it
// changed, so a rescan that finds the same devices touches nothing.
type CDIWriter struct {
	// Dir is the container runtime's CDI spec directory, e.g. /var/run/cdi.
	Dir string

	mu   sync.Mutex
	last []byte
}

// Write writes spec unless it is what was written last.
func (w *CDIWriter) Write(spec cdispec.Spec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec %s: %w", spec.Kind, err)
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if string(b) == string(w.last) {
		return nil
	}
	if err := os.MkdirAll(w.Dir, 0o755); err != nil {
		return fmt.Errorf("create CDI spec directory: %w", err)
	}
	if err := fileutil.WriteAtomic(filepath.Join(w.Dir, CDISpecFile(spec.Kind)), b, 0o644); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	w.last = b
	return nil
}
