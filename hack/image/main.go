// Command image writes a container image archive from static binaries,
// without Docker or any other container engine: one layer holding the
// binaries, /etc/passwd, /etc/group and /tmp, on no base image.
//
// The archive is an OCI image layout that also carries Docker's
// manifest.json, as "docker save" writes since Docker 25, so every usual
// loader takes it: kind load image-archive, docker load, podman load,
// ctr images import, skopeo copy oci-archive:/docker-archive:. The same
// inputs give the same bytes (fixed times, sorted entries).
//
//	go run ./hack/image -tag ghcr.io/dpkit/dpkit-plugin:v0.1.0 \
//	    -file bin/linux_amd64/dpkit-plugin=/usr/bin/dpkit \
//	    -entrypoint /usr/bin/dpkit -cmd plugin -cmd --config=/etc/dpkit/config.yaml \
//	    -expose 9400/tcp -o bin/images/dpkit-plugin.tar
//
// make images runs it (hack/images.sh).
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// Spec is what goes into one image.
type Spec struct {
	// Tag is the image's full reference, e.g. ghcr.io/dpkit/dpkit:v0.1.0.
	Tag string
	// Files maps a path in the image (absolute) to the local file copied
	// there with mode 0755.
	Files map[string]string
	// Entrypoint, Cmd, User and ExposedPorts are the image config's.
	Entrypoint   []string
	Cmd          []string
	User         string
	ExposedPorts []string
	// OS and Arch are the image's platform, e.g. linux and amd64.
	OS, Arch string
	// Labels are the image config's labels.
	Labels map[string]string
}

// Media types of the OCI image spec (v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// epoch is the time of every entry and of the image, for reproducible
// archives.
var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type imageConfig struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User         string              `json:"User,omitempty"`
		Env          []string            `json:"Env"`
		Entrypoint   []string            `json:"Entrypoint,omitempty"`
		Cmd          []string            `json:"Cmd,omitempty"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
		Labels       map[string]string   `json:"Labels,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []map[string]string `json:"history"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// dockerManifest is one entry of Docker's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// Validate reports every problem of s at once.
func (s Spec) Validate() error {
	var errs []error
	name, tag, ok := splitTag(s.Tag)
	if !ok {
		errs = append(errs, fmt.Errorf("-tag %q: want a full reference with a tag, e.g. ghcr.io/dpkit/dpkit:v0.1.0", s.Tag))
	} else if name != strings.ToLower(name) || strings.ContainsAny(tag, "/ ") {
		errs = append(errs, fmt.Errorf("-tag %q: the repository must be lower case and the tag one word", s.Tag))
	}
	if len(s.Files) == 0 {
		errs = append(errs, errors.New("-file: at least one LOCAL=/PATH/IN/IMAGE is needed"))
	}
	for dst, src := range s.Files {
		if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
			errs = append(errs, fmt.Errorf("-file %s=%s: the path in the image must be absolute and clean, e.g. /usr/bin/dpkit", src, dst))
		}
		if fi, err := os.Stat(src); err != nil {
			errs = append(errs, fmt.Errorf("-file %s=%s: %w", src, dst, err))
		} else if !fi.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("-file %s=%s: %s is not a regular file", src, dst, src))
		}
	}
	if s.OS == "" || s.Arch == "" {
		errs = append(errs, errors.New("-os and -arch must not be empty, e.g. -os linux -arch amd64"))
	}
	for _, p := range s.ExposedPorts {
		if _, proto, ok := strings.Cut(p, "/"); !ok || (proto != "tcp" && proto != "udp") {
			errs = append(errs, fmt.Errorf("-expose %q: want PORT/tcp or PORT/udp, e.g. 9400/tcp", p))
		}
	}
	return errors.Join(errs...)
}

// splitTag splits ref into its repository and tag; the tag follows the
// last colon after the last slash.
func splitTag(ref string) (name, tag string, ok bool) {
	i := strings.LastIndex(ref, ":")
	if i <= 0 || i < strings.LastIndex(ref, "/") || i == len(ref)-1 {
		return "", "", false
	}
	return ref[:i], ref[i+1:], true
}

// Write writes the image archive of s to w.
func Write(w io.Writer, s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	layer, err := buildLayer(s.Files)
	if err != nil {
		return err
	}
	layerDesc := describe(mediaLayer, layer)

	var cfg imageConfig
	cfg.Created = epoch.Format(time.RFC3339)
	cfg.Architecture, cfg.OS = s.Arch, s.OS
	cfg.Config.User = s.User
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.Config.Entrypoint, cfg.Config.Cmd = s.Entrypoint, s.Cmd
	if len(s.ExposedPorts) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range s.ExposedPorts {
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	cfg.Config.Labels = s.Labels
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{layerDesc.Digest}
	cfg.History = []map[string]string{{"created": cfg.Created, "created_by": "hack/image"}}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgDesc := describe(mediaConfig, cfgJSON)

	man, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: mediaManifest, Config: cfgDesc, Layers: []descriptor{layerDesc}})
	if err != nil {
		return err
	}
	manDesc := describe(mediaManifest, man)
	_, tag, _ := splitTag(s.Tag)
	manDesc.Annotations = map[string]string{
		// containerd (ctr import, kind load) names the image after this;
		// the OCI annotation carries the tag alone, as the spec asks.
		"io.containerd.image.name":          s.Tag,
		"org.opencontainers.image.ref.name": tag,
	}
	idx, err := json.Marshal(index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{manDesc}})
	if err != nil {
		return err
	}
	docker, err := json.Marshal([]dockerManifest{{
		Config:   blobPath(cfgDesc.Digest),
		RepoTags: []string{s.Tag},
		Layers:   []string{blobPath(layerDesc.Digest)},
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(dirHeader(d, 0o755)); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{blobPath(layerDesc.Digest), layer},
		{blobPath(cfgDesc.Digest), cfgJSON},
		{blobPath(manDesc.Digest), man},
		{"index.json", idx},
		{"manifest.json", docker},
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	} {
		if err := writeFile(tw, f.name, 0o644, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func blobPath(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

func describe(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

// buildLayer returns the uncompressed layer: the directories every file
// needs, /etc/passwd and /etc/group with root and nobody (as distroless
// has), /tmp, and the files, all owned by root.
func buildLayer(files map[string]string) ([]byte, error) {
	dirs := map[string]bool{"etc/": true, "tmp/": true}
	for dst := range files {
		for d := path.Dir(dst); d != "/"; d = path.Dir(d) {
			dirs[strings.TrimPrefix(d, "/")+"/"] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range slices.Sorted(mapKeys(dirs)) {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(dirHeader(d, mode)); err != nil {
			return nil, err
		}
	}
	etc := map[string]string{
		"etc/group":  "root:x:0:\nnobody:x:65534:\n",
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
	}
	for _, name := range slices.Sorted(mapKeys(etc)) {
		if err := writeFile(tw, name, 0o644, []byte(etc[name])); err != nil {
			return nil, err
		}
	}
	for _, dst := range slices.Sorted(mapKeys(files)) {
		data, err := os.ReadFile(files[dst])
		if err != nil {
			return nil, err
		}
		if err := writeFile(tw, strings.TrimPrefix(dst, "/"), 0o755, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func dirHeader(name string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: epoch, Format: tar.FormatPAX}
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		s                         Spec
		files, labels, entry, cmd list
		expose                    list
		out                       string
	)
	fs.StringVar(&s.Tag, "tag", "", "full image reference, e.g. ghcr.io/dpkit/dpkit:v0.1.0 (required)")
	fs.Var(&files, "file", "LOCAL=/PATH/IN/IMAGE: a binary to copy into the image (repeatable)")
	fs.Var(&entry, "entrypoint", "an entrypoint word (repeatable)")
	fs.Var(&cmd, "cmd", "a default argument word (repeatable)")
	fs.StringVar(&s.User, "user", "", "user[:group] the image runs as, e.g. 0:0")
	fs.Var(&expose, "expose", "PORT/tcp the image exposes (repeatable)")
	fs.Var(&labels, "label", "KEY=VALUE image label (repeatable)")
	fs.StringVar(&s.OS, "os", "linux", "image OS")
	fs.StringVar(&s.Arch, "arch", "amd64", "image architecture (GOARCH)")
	fs.StringVar(&out, "o", "", "archive to write (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if out == "" {
		return errors.New("-o: the archive to write is required, e.g. -o bin/images/dpkit.tar")
	}
	s.Entrypoint, s.Cmd, s.ExposedPorts = entry, cmd, expose
	s.Files = map[string]string{}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("-file %q: want LOCAL=/PATH/IN/IMAGE, e.g. bin/dpkit=/usr/bin/dpkit", f)
		}
		s.Files[dst] = src
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	var buf bytes.Buffer
	if err := Write(&buf, s); err != nil {
		return err
	}
	// Written whole or not at all: a loader never sees half an archive.
	return fileutil.WriteAtomic(out, buf.Bytes(), 0o644)
}
