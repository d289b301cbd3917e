// Package version holds the version of dpkit. A build may set another at
// link time with
//
//	-ldflags "-X github.com/dpkit/dpkit/internal/version.Version=v0.1.1"
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the version of this source tree. The container images are
// tagged with it (make images) and the manifests under deploy/ pin it; a
// test in internal/archtest keeps the Makefile, the Dockerfile, the
// manifests and the docs on this one tag. The Makefile reads it from this
// line, so keep its form.
var Version = "v0.1.0"

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	Revision  string `json:"revision,omitempty"`
}

// Get returns the version information of the running binary.
func Get() Info {
	info := Info{Version: Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				info.Revision = s.Value
			}
		}
	}
	return info
}
