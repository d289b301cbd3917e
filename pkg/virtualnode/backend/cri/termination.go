package cri

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// etcHostsMount is the pod's managed /etc/hosts, as the kubelet mounts
// it: when the pod has an address (the node's with hostNetwork) and the
// container mounts nothing of its own there.
func (pr *podRun) etcHostsMount(spec *corev1.Container) (*runtimeapi.Mount, error) {
	pr.mu.Lock()
	ip := pr.podIP
	pr.mu.Unlock()
	if pr.pod.Spec.HostNetwork {
		ip = pr.b.cfg.NodeIP
	}
	if ip == "" {
		return nil, nil
	}
	for _, m := range spec.VolumeMounts {
		if m.MountPath == "/etc/hosts" {
			return nil, nil
		}
	}
	path, err := pr.ensureEtcHosts(ip)
	if err != nil {
		return nil, fmt.Errorf("writing the pod's /etc/hosts: %w", err)
	}
	return &runtimeapi.Mount{ContainerPath: "/etc/hosts", HostPath: path}, nil
}

// containerDir is where a container's termination message files are.
func (pr *podRun) containerDir(name string) string {
	return filepath.Join(pr.podDir(), "containers", name)
}

// terminationMessageMount is the file the container may write its
// termination message to, as the kubelet's: a new world-writable file
// <pod dir>/containers/<name>/<random> per run, at
// terminationMessagePath.
func (pr *podRun) terminationMessageMount(spec *corev1.Container) (*runtimeapi.Mount, error) {
	if spec.TerminationMessagePath == "" {
		return nil, nil
	}
	dir := pr.containerDir(spec.Name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(dir, fmt.Sprintf("%08x", binary.BigEndian.Uint32(b[:])))
	f, err := os.Create(path) //nolint:gosec // under the pod's directory
	if err != nil {
		return nil, fmt.Errorf("creating the termination message file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil { //nolint:gosec // any user of the container writes it, as under the kubelet
		return nil, err
	}
	return &runtimeapi.Mount{ContainerPath: spec.TerminationMessagePath, HostPath: path}, nil
}

// removeTerminationFiles removes the termination message files among
// mounts: those the backend made under the pod's containers directory.
func (pr *podRun) removeTerminationFiles(mounts []*runtimeapi.Mount) {
	base := filepath.Join(pr.podDir(), "containers")
	for _, m := range mounts {
		if filepath.Dir(filepath.Dir(m.HostPath)) != base {
			continue
		}
		if err := os.Remove(m.HostPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			pr.b.log.Warn("Removing a termination message file", "pod", pr.key(), "path", m.HostPath, "err", err)
		}
	}
}

// terminationMessage is what the kubelet adds to an exited container's
// message (podruntime.TerminationMessage). The file read is the one the
// backend made for the run, in dir (the container's directory under the
// pod's): a volume the pod mounts at the same path is never read, so a
// link the pod planted there cannot put a node file into the status.
func terminationMessage(spec *corev1.Container, s *runtimeapi.ContainerStatus, dir string) string {
	file := ""
	if spec.TerminationMessagePath != "" {
		for _, m := range s.Mounts {
			if m.ContainerPath == spec.TerminationMessagePath && filepath.Dir(m.HostPath) == dir {
				file = m.HostPath
				break
			}
		}
	}
	return podruntime.TerminationMessage(spec, s.ExitCode, file, s.LogPath)
}
