// Command image writes one of dpkit's two container images as an archive,
// without Docker or any other container engine: internal/imagespec says
// what the image holds, internal/ociimage writes it (an OCI image layout
// with Docker's manifest.json, reproducible: the same binary gives the same
// digests). make images runs it for both images (hack/images.sh):
//
//	go run ./hack/image -image plugin -binary bin/linux_amd64/dpkit-plugin \
//	    -tag ghcr.io/dpkit/dpkit-plugin:v0.1.0 -version v0.1.0 -arch amd64 \
//	    -o bin/images/dpkit-plugin.tar
//
// It prints the archive, the image's name and its manifest digest (what
// `ctr images ls` and registries show).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dpkit/dpkit/internal/imagespec"
	"github.com/dpkit/dpkit/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// images are the images -image names.
var images = map[string]func(imagespec.Input) ociimage.Image{
	"plugin": imagespec.Plugin,
	"full":   imagespec.Full,
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		kind, out string
		in        imagespec.Input
	)
	fs.StringVar(&kind, "image", "", "which image: plugin (the lean \"dpkit plugin\" build) or full (cmd/dpkit-cluster)")
	fs.StringVar(&in.Binary, "binary", "", "the static linux binary that becomes /usr/bin/dpkit")
	fs.StringVar(&in.Name, "tag", "", "the image's full reference, e.g. ghcr.io/dpkit/dpkit:v0.1.0")
	fs.StringVar(&in.Version, "version", "", "the org.opencontainers.image.version label, e.g. v0.1.0")
	fs.StringVar(&in.Arch, "arch", "", "the binary's GOARCH (default: this machine's)")
	fs.StringVar(&out, "o", "", "the archive to write, e.g. bin/images/dpkit.tar")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	image, ok := images[kind]
	if !ok {
		errs = append(errs, fmt.Errorf("-image %q: want plugin or full", kind))
	}
	if in.Binary == "" {
		errs = append(errs, errors.New("-binary: the binary to pack is required, e.g. -binary bin/linux_amd64/dpkit-plugin"))
	}
	if in.Name == "" {
		errs = append(errs, errors.New("-tag: the image's full reference is required, e.g. -tag ghcr.io/dpkit/dpkit:v0.1.0"))
	}
	if in.Version == "" {
		errs = append(errs, errors.New("-version: the image's version label is required, e.g. -version v0.1.0"))
	}
	if out == "" {
		errs = append(errs, errors.New("-o: the archive to write is required, e.g. -o bin/images/dpkit.tar"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q: every input is a flag", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	res, err := ociimage.WriteFile(out, image(in))
	if err != nil {
		return fmt.Errorf("-image %s -tag %s -binary %s: %w", kind, in.Name, in.Binary, err)
	}
	_, err = fmt.Fprintf(stdout, "%s  %s  %s\n", out, in.Name, res.Manifest.Digest)
	return err
}
