// Package ociimage writes container images as OCI image layouts packed in a
// tar archive, from files on the build machine: no container daemon, no
// base image, no registry. The archive also carries Docker's manifest.json
// beside index.json, as `docker save` writes since Docker 25, so every
// usual loader takes it: `ctr images import`, `kind load image-archive`,
// `docker load` (older releases too), `podman load`, skopeo's
// oci-archive: and docker-archive: transports.
//
// The output is reproducible: the same files and configuration give the
// same bytes, so the same digests. Every tar entry has a fixed time
// (Image.Created, the Unix epoch when zero), owner and order; the layer is
// gzip-compressed without a name or time in its header; JSON is marshalled
// from structs in a fixed field order. (Only the Go toolchain's gzip
// encoder could change the compressed bytes between Go releases; the
// layer's diff ID, its uncompressed digest, cannot change.)
//
// One image has one layer: the images dpkit builds are a static binary and
// a few files, and a single layer is what a distroless-style image needs.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// Media types and annotations of the OCI image specification v1.1, and
// the annotation containerd reads for an image's full name.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	AnnotationRefName       = "org.opencontainers.image.ref.name"
	AnnotationContainerName = "io.containerd.image.name"
)

// File is one entry of the image's filesystem.
type File struct {
	// Path inside the image, absolute or relative to its root:
	// "/usr/bin/dpkit". Parent directories are added (0755, root-owned)
	// when not listed.
	Path string
	// Mode holds the permission bits and the type: 0 type bits for a
	// regular file, fs.ModeDir for a directory, fs.ModeSymlink for a
	// symbolic link (Target), fs.ModeCharDevice|fs.ModeDevice is refused.
	Mode fs.FileMode
	// Data is a regular file's content, unless Source is set.
	Data []byte
	// Source is a file on the build machine whose content is copied (its
	// own mode and time are ignored: Mode and Image.Created are used).
	Source string
	// Target is a symbolic link's target.
	Target string
	// UID and GID own the entry.
	UID, GID int
}

// Config is the image's runtime configuration (the OCI image config's
// "config" object): what a container runs by default.
type Config struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
	StopSignal   string              `json:"StopSignal,omitempty"`
}

// Image is what Write packs.
type Image struct {
	// Name is the image's full reference, "registry/repo:tag"
	// ("ghcr.io/dpkit/dpkit-plugin:v0.1.0"). Importers name the image
	// after it: containerd by the io.containerd.image.name annotation,
	// OCI tools by org.opencontainers.image.ref.name (the tag).
	Name string
	// OS and Architecture of the binaries inside: "linux", "amd64".
	OS, Architecture string
	// Config is the runtime configuration.
	Config Config
	// Files make up the single layer.
	Files []File
	// Created is the time recorded in the config and on every tar entry.
	// Zero means the Unix epoch, for reproducibility; SOURCE_DATE_EPOCH is
	// the usual source of a non-zero one.
	Created time.Time
}

// Descriptor points at one blob, as in the OCI specification.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is a manifest's platform in an index.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Result tells what Write wrote.
type Result struct {
	// Manifest is the image manifest's descriptor: its digest is the
	// image's identity (what `ctr images ls` and registries show).
	Manifest Descriptor
	// Config is the config blob's descriptor: its digest is the image ID
	// Docker shows.
	Config Descriptor
	// Layer is the compressed layer's descriptor; DiffID its uncompressed
	// digest.
	Layer  Descriptor
	DiffID string
}

type imageConfig struct {
	Created      string       `json:"created"`
	Architecture string       `json:"architecture"`
	OS           string       `json:"os"`
	Config       Config       `json:"config"`
	RootFS       rootFS       `json:"rootfs"`
	History      []historyRow `json:"history"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type historyRow struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// dockerManifest is one entry of Docker's manifest.json: `docker load`
// before Docker 25 reads only this, and names the image after RepoTags.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// Validate reports every problem of img at once, each naming its field.
func (img *Image) Validate() error {
	var errs []error
	switch t := tag(img.Name); {
	case img.Name == "":
		errs = append(errs, errors.New("image: Name is empty: give the full reference, e.g. ghcr.io/dpkit/dpkit:dev"))
	case t == "":
		errs = append(errs, fmt.Errorf("image: Name %q has no tag: end it with :TAG, e.g. %s:dev", img.Name, img.Name))
	case strings.ContainsAny(t, "/ ") || strings.TrimSuffix(img.Name, ":"+t) != strings.ToLower(strings.TrimSuffix(img.Name, ":"+t)):
		errs = append(errs, fmt.Errorf("image: Name %q: the repository must be lower case and the tag one word, e.g. ghcr.io/dpkit/dpkit:dev", img.Name))
	}
	for _, p := range sortedKeys(img.Config.ExposedPorts) {
		if port, proto, ok := strings.Cut(p, "/"); !ok || port == "" || (proto != "tcp" && proto != "udp") {
			errs = append(errs, fmt.Errorf("image: Config.ExposedPorts %q: want PORT/tcp or PORT/udp, e.g. 9400/tcp", p))
		}
	}
	if img.OS == "" {
		errs = append(errs, errors.New("image: OS is empty: set it to the binaries' GOOS, e.g. linux"))
	}
	if img.Architecture == "" {
		errs = append(errs, errors.New("image: Architecture is empty: set it to the binaries' GOARCH, e.g. amd64"))
	}
	seen := map[string]bool{}
	for i, f := range img.Files {
		p := cleanPath(f.Path)
		switch {
		case p == "":
			errs = append(errs, fmt.Errorf("image: Files[%d].Path %q names the root: give a path below /", i, f.Path))
			continue
		case seen[p]:
			errs = append(errs, fmt.Errorf("image: Files[%d].Path %q is listed twice", i, f.Path))
		}
		seen[p] = true
		switch {
		case f.Mode&fs.ModeSymlink != 0:
			if f.Target == "" {
				errs = append(errs, fmt.Errorf("image: Files[%d] (%s) is a symlink without a Target", i, f.Path))
			}
		case f.Mode.IsDir():
		case f.Mode.Type() != 0:
			errs = append(errs, fmt.Errorf("image: Files[%d] (%s) has type %v: only regular files, directories and symlinks are supported", i, f.Path, f.Mode.Type()))
		case f.Source != "" && f.Data != nil:
			errs = append(errs, fmt.Errorf("image: Files[%d] (%s) sets both Data and Source: keep one", i, f.Path))
		case f.Source != "":
			if fi, err := os.Stat(f.Source); err != nil {
				errs = append(errs, fmt.Errorf("image: Files[%d] (%s): Source: %w", i, f.Path, err))
			} else if !fi.Mode().IsRegular() {
				errs = append(errs, fmt.Errorf("image: Files[%d] (%s): Source %s is not a regular file", i, f.Path, f.Source))
			}
		}
	}
	return errors.Join(errs...)
}

// tag returns the tag of a reference: what follows the last colon after
// the last slash.
func tag(ref string) string {
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func cleanPath(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// packed is an image's blobs and what Write reports.
type packed struct {
	res                         Result
	created                     time.Time
	cfgBlob, layerBlob, manBlob []byte
}

// pack builds img's config, layer and manifest.
func pack(img Image) (packed, error) {
	if err := img.Validate(); err != nil {
		return packed{}, err
	}
	created := img.Created.UTC()
	if img.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	layerTar, err := layer(img.Files, created)
	if err != nil {
		return packed{}, err
	}
	diffID := digest(layerTar)
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return packed{}, err
	}
	// The zero gzip header: no name, no time, OS "unknown".
	if _, err := zw.Write(layerTar); err != nil {
		return packed{}, err
	}
	if err := zw.Close(); err != nil {
		return packed{}, err
	}
	layerBlob := gz.Bytes()
	stamp := created.Format(time.RFC3339)
	cfgBlob, err := json.Marshal(imageConfig{
		Created:      stamp,
		Architecture: img.Architecture,
		OS:           img.OS,
		Config:       img.Config,
		RootFS:       rootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []historyRow{{Created: stamp, CreatedBy: "dpkit ociimage: one layer of static files"}},
	})
	if err != nil {
		return packed{}, err
	}
	res := Result{
		Config: Descriptor{MediaType: MediaTypeConfig, Digest: digest(cfgBlob), Size: int64(len(cfgBlob))},
		Layer:  Descriptor{MediaType: MediaTypeLayer, Digest: digest(layerBlob), Size: int64(len(layerBlob))},
		DiffID: diffID,
	}
	manBlob, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: res.Config, Layers: []Descriptor{res.Layer}})
	if err != nil {
		return packed{}, err
	}
	res.Manifest = Descriptor{
		MediaType: MediaTypeManifest, Digest: digest(manBlob), Size: int64(len(manBlob)),
		Annotations: map[string]string{AnnotationRefName: tag(img.Name), AnnotationContainerName: img.Name},
		Platform:    &Platform{Architecture: img.Architecture, OS: img.OS},
	}
	return packed{res: res, created: created, cfgBlob: cfgBlob, layerBlob: layerBlob, manBlob: manBlob}, nil
}

// Blobs returns what Write reports and img's blobs by digest (its
// config, layer and manifest, the bytes Write packs): what a registry
// serves for the image, the manifest under Result.Manifest.Digest.
func Blobs(img Image) (Result, map[string][]byte, error) {
	p, err := pack(img)
	if err != nil {
		return Result{}, nil, err
	}
	return p.res, map[string][]byte{
		p.res.Config.Digest:   p.cfgBlob,
		p.res.Layer.Digest:    p.layerBlob,
		p.res.Manifest.Digest: p.manBlob,
	}, nil
}

// Write writes img as an OCI image layout in a tar archive to w.
func Write(w io.Writer, img Image) (Result, error) {
	p, err := pack(img)
	if err != nil {
		return Result{}, err
	}
	res, created, cfgBlob, layerBlob, manBlob := p.res, p.created, p.cfgBlob, p.layerBlob, p.manBlob
	idxBlob, err := json.Marshal(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{res.Manifest}})
	if err != nil {
		return Result{}, err
	}
	dockerBlob, err := json.Marshal([]dockerManifest{{
		Config: blobPath(res.Config.Digest), RepoTags: []string{img.Name}, Layers: []string{blobPath(res.Layer.Digest)},
	}})
	if err != nil {
		return Result{}, err
	}
	tw := tar.NewWriter(w)
	entry := func(name string, mode int64, data []byte) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}
		if data == nil {
			h.Typeflag, h.Name, h.Size = tar.TypeDir, name+"/", 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blobs := []struct {
		digest string
		data   []byte
	}{{res.Config.Digest, cfgBlob}, {res.Layer.Digest, layerBlob}, {res.Manifest.Digest, manBlob}}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].digest < blobs[j].digest })
	steps := []func() error{
		func() error { return entry("blobs", 0o755, nil) },
		func() error { return entry("blobs/sha256", 0o755, nil) },
	}
	for _, b := range blobs {
		steps = append(steps, func() error { return entry(blobPath(b.digest), 0o644, b.data) })
	}
	steps = append(steps,
		func() error { return entry("index.json", 0o644, idxBlob) },
		func() error { return entry("manifest.json", 0o644, dockerBlob) },
		func() error { return entry("oci-layout", 0o644, []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
	)
	for _, step := range steps {
		if err := step(); err != nil {
			return Result{}, fmt.Errorf("image %s: write archive: %w", img.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return Result{}, fmt.Errorf("image %s: write archive: %w", img.Name, err)
	}
	return res, nil
}

// blobPath is where a blob lies in the layout.
func blobPath(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

// WriteFile writes img to the file at path, whole or not at all (a loader
// never sees half an archive), replacing what was there.
func WriteFile(path string, img Image) (Result, error) {
	var buf bytes.Buffer
	res, err := Write(&buf, img)
	if err != nil {
		return Result{}, err
	}
	if err := fileutil.WriteAtomic(path, buf.Bytes(), 0o644); err != nil {
		return Result{}, fmt.Errorf("image %s: %w", img.Name, err)
	}
	return res, nil
}

// layer returns the uncompressed layer tar: every file and its parent
// directories, sorted by path.
func layer(files []File, created time.Time) ([]byte, error) {
	all := map[string]File{}
	for _, f := range files {
		p := cleanPath(f.Path)
		f.Path = p
		all[p] = f
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = File{Path: d, Mode: fs.ModeDir | 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		f := all[p]
		h := &tar.Header{
			Name: p, Mode: int64(f.Mode.Perm()),
			Uid: f.UID, Gid: f.GID, ModTime: created, Format: tar.FormatPAX,
		}
		if f.Mode&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if f.Mode&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if f.Mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		var data []byte
		switch {
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case f.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Target
		default:
			h.Typeflag = tar.TypeReg
			data = f.Data
			if f.Source != "" {
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, fmt.Errorf("image file %s: %w", f.Path, err)
				}
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
