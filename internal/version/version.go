// Package version holds the build's version, set at link time with
//
//	-ldflags "-X github.com/dpkit/dpkit/internal/version.Version=v0.1.0"
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the release version; "dev" for local builds.
var Version = "dev"

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
