package e2e

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/ociimage"
)

// registry serves images to pull over plain HTTP on loopback, the
// read-only part of the OCI distribution API a runtime uses for a pull:
// GET /v2/, and HEAD and GET of manifests (by tag or digest) and blobs
// (by digest). It lets a test pull with no network, as a registry
// mirror serves an air-gapped cluster.
type registry struct {
	addr string

	tags  map[string]string // "library/foo:latest" -> manifest digest
	blobs map[string]blob

	mu     sync.Mutex
	pulled map[string]int // repository -> manifest requests by tag
}

type blob struct {
	mediaType string
	data      []byte
}

// serveRegistry serves imgs, each under its repository and tag in the
// namespace of its registry host: "docker.io/library/foo:latest" is
// library/foo:latest, what a runtime asks a mirror of docker.io for.
func serveRegistry(t *testing.T, imgs ...ociimage.Image) *registry {
	t.Helper()
	r := &registry{tags: map[string]string{}, blobs: map[string]blob{}, pulled: map[string]int{}}
	for _, img := range imgs {
		res, blobs, err := ociimage.Blobs(img)
		if err != nil {
			t.Fatal(err)
		}
		for d, b := range blobs {
			mt := "application/octet-stream"
			if d == res.Manifest.Digest {
				mt = res.Manifest.MediaType
			}
			r.blobs[d] = blob{mt, b}
		}
		_, repoTag, ok := strings.Cut(img.Name, "/")
		if !ok {
			t.Fatalf("image %q: want registry/repository:tag", img.Name)
		}
		r.tags[repoTag] = res.Manifest.Digest
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	r.addr = ln.Addr().String()
	return r
}

// pulls returns how many times the manifest of repository was asked for
// by tag: once per pull.
func (r *registry) pulls(repository string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pulled[repository]
}

func (r *registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		http.Error(w, "read-only registry", http.StatusMethodNotAllowed)
		return
	}
	p := req.URL.Path
	if p == "/v2/" || p == "/v2" {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		return
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		http.NotFound(w, req)
		return
	}
	var b blob
	var digest string
	if repo, ref, ok := cutLast(rest, "/manifests/"); ok {
		digest = ref
		if !strings.HasPrefix(ref, "sha256:") {
			digest = r.tags[repo+":"+ref]
			r.mu.Lock()
			r.pulled[repo]++
			r.mu.Unlock()
		}
		b, ok = r.blobs[digest]
		if !ok || b.mediaType != ociimage.MediaTypeManifest {
			writeRegistryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown")
			return
		}
	} else if _, ref, ok := cutLast(rest, "/blobs/"); ok {
		digest = ref
		if b, ok = r.blobs[digest]; !ok {
			writeRegistryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "blob unknown to registry")
			return
		}
	} else {
		http.NotFound(w, req)
		return
	}
	w.Header().Set("Content-Type", b.mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b.data)))
	w.Header().Set("Docker-Content-Digest", digest)
	if req.Method == http.MethodGet {
		_, _ = w.Write(b.data)
	}
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+len(sep):], true
}

func writeRegistryError(w http.ResponseWriter, code int, errCode, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(`{"errors":[{"code":"` + errCode + `","message":"` + msg + `"}]}`))
}
