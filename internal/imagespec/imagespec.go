// Package imagespec defines dpkit's two container images once: the full
// image (every subcommand) and the lean plugin image ("dpkit plugin" only,
// for device plugin DaemonSets). `make image` writes them with
// internal/ociimage, the real-node e2e tests import the plugin image, and
// a test holds the Dockerfile's stages to the same entrypoint, user, ports
// and labels.
//
// Both images are one static binary at /usr/bin/dpkit plus the few files
// of a distroless "static" base that a static Go binary can use: the
// passwd and group entries of root, nonroot (65532) and nobody, and /tmp.
package imagespec

import (
	"io/fs"
	"runtime"

	"github.com/dpkit/dpkit/internal/ociimage"
)

// The images' repositories, as deploy/ and the Dockerfile name them.
const (
	FullRepository   = "ghcr.io/dpkit/dpkit"
	PluginRepository = "ghcr.io/dpkit/dpkit-plugin"
)

// Path is the images' PATH, a distroless base's.
const Path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// BinaryPath is where the binary sits in both images.
const BinaryPath = "/usr/bin/dpkit"

// MetricsPort is the plugin's /metrics, /healthz and /readyz port.
const MetricsPort = "9400/tcp"

// Labels returns the OCI annotations both images carry as labels.
func Labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   "https://github.com/dpkit/dpkit",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  version,
	}
}

// base is what every image has besides the binary.
func base(binary string) []ociimage.File {
	return []ociimage.File{
		{Path: BinaryPath, Mode: 0o755, Source: binary},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
	}
}

// Input is what one image is made from.
type Input struct {
	// Binary is the static Linux binary that becomes /usr/bin/dpkit.
	Binary string
	// Name is the image's full reference, e.g. ghcr.io/dpkit/dpkit:v0.1.0.
	Name string
	// Version goes into the org.opencontainers.image.version label.
	Version string
	// Arch is the binary's GOARCH; empty means this machine's.
	Arch string
}

func (in Input) arch() string {
	if in.Arch == "" {
		return runtime.GOARCH
	}
	return in.Arch
}

// PluginCmd is the plugin image's default command: the config file the
// DaemonSets mount and the probes' port.
var PluginCmd = []string{"plugin", "--config", "/etc/dpkit/config.yaml", "--metrics-address", ":9400"}

// Plugin returns the lean plugin image (the binary built with the
// dpkit_lean tag). It runs as root only to create sockets in the
// kubelet's root-owned directories; the manifests drop every capability.
func Plugin(in Input) ociimage.Image {
	return ociimage.Image{
		Name: in.Name, OS: "linux", Architecture: in.arch(),
		Config: ociimage.Config{
			User:         "0:0",
			Env:          []string{Path},
			ExposedPorts: map[string]struct{}{MetricsPort: {}},
			Entrypoint:   []string{BinaryPath},
			Cmd:          PluginCmd,
			Labels:       Labels(in.Version),
		},
		Files: base(in.Binary),
	}
}

// Full returns the full image (cmd/dpkit-cluster: every command).
func Full(in Input) ociimage.Image {
	return ociimage.Image{
		Name: in.Name, OS: "linux", Architecture: in.arch(),
		Config: ociimage.Config{
			User:       "0:0",
			Env:        []string{Path},
			Entrypoint: []string{BinaryPath},
			Labels:     Labels(in.Version),
		},
		Files: base(in.Binary),
	}
}
