// Package checkpoint reads and writes the device manager checkpoint
// (device-plugins/kubelet_internal_checkpoint) in the kubelet's format, so a
// kubelet can read what dpkit writes and dpkit can read what a kubelet
// wrote.
//
// The file is the JSON encoding of
//
//	{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {...}}, "Checksum": N}
//
// where N is the kubelet checksum of the Data value: FNV-32a over the text
// that go-spew prints for it with "%#v" and the configuration of
// k8s.io/utils/dump.ForHash (indent " ", sorted and spewed map keys,
// methods disabled, no pointer addresses, no capacities). Spew prints type
// names as "<package name>.<type name>", so the types here deliberately
// carry the kubelet's names (package checkpoint, types checkpointData,
// PodDevicesEntry, DevicesPerNUMA) and field order: renaming any of them
// changes every checksum.
package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// FileName is the checkpoint's file name inside the device plugin
// directory.
const FileName = "kubelet_internal_checkpoint"

// DevicesPerNUMA maps a NUMA node ID to the device IDs attached to it; -1
// holds devices without NUMA information. A device attached to several
// nodes is listed under each of them.
type DevicesPerNUMA map[int64][]string

// PodDevicesEntry is one container's devices of one resource and the
// plugin's Allocate answer for them (a marshalled
// v1beta1.ContainerAllocateResponse).
type PodDevicesEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     DevicesPerNUMA
	AllocResp     []byte
}

// checkpointData must keep this exact name and field order: see the package
// documentation.
type checkpointData struct {
	PodDeviceEntries  []PodDevicesEntry
	RegisteredDevices map[string][]string
}

type file struct {
	Data     checkpointData
	Checksum uint64
}

// Checkpoint is the decoded content of a checkpoint file.
type Checkpoint struct {
	// Entries are the pod device assignments.
	Entries []PodDevicesEntry
	// Registered maps every resource known when the checkpoint was written
	// to its healthy device IDs at that time. The kubelet only uses the
	// keys on restart.
	Registered map[string][]string
}

// ErrNotFound is returned by Read when there is no checkpoint file.
var ErrNotFound = errors.New("checkpoint not found")

// CorruptError reports a checkpoint whose checksum does not match its data.
type CorruptError struct {
	Expected, Actual uint64
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint is corrupted: checksum %d in the file, %d computed from its data", e.Expected, e.Actual)
}

// Checksum returns the kubelet checksum of a checkpoint's data.
func Checksum(cp Checkpoint) uint64 {
	return checksum(checkpointData{PodDeviceEntries: cp.Entries, RegisteredDevices: cp.Registered})
}

func checksum(d checkpointData) uint64 {
	entries := make([]*Entry, len(d.PodDeviceEntries))
	for i, e := range d.PodDeviceEntries {
		entries[i] = &Entry{PodDevicesEntry: e, spew: appendEntrySpew(nil, e)}
	}
	return spewChecksum(entries, d.PodDeviceEntries == nil, d.RegisteredDevices)
}

// Marshal encodes cp with its checksum. Nil entries and registered maps are
// written as [] and {} like the kubelet does.
func Marshal(cp Checkpoint) ([]byte, error) {
	return MarshalEntries(encodeAll(cp.Entries), cp.Registered), nil
}

// Unmarshal decodes a checkpoint and verifies its checksum. It returns a
// *CorruptError when the checksum does not match.
func Unmarshal(blob []byte) (Checkpoint, error) {
	var f file
	dec := json.NewDecoder(bytes.NewReader(blob))
	if err := dec.Decode(&f); err != nil {
		return Checkpoint{}, fmt.Errorf("decode checkpoint: %w", err)
	}
	if dec.More() {
		return Checkpoint{}, errors.New("decode checkpoint: trailing data after the JSON object")
	}
	if got := checksum(f.Data); got != f.Checksum {
		return Checkpoint{}, &CorruptError{Expected: f.Checksum, Actual: got}
	}
	return Checkpoint{Entries: f.Data.PodDeviceEntries, Registered: f.Data.RegisteredDevices}, nil
}

// Read reads and verifies the checkpoint at path. It returns ErrNotFound
// when the file does not exist.
func Read(path string) (Checkpoint, error) {
	blob, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Checkpoint{}, ErrNotFound
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("read checkpoint: %w", err)
	}
	cp, err := Unmarshal(blob)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%s: %w", path, err)
	}
	return cp, nil
}

// Write encodes cp and replaces the file at path atomically: it writes a
// temporary file in the same directory, syncs it, renames it over path and
// syncs the directory.
func Write(path string, cp Checkpoint) error {
	blob, err := Marshal(cp)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	return WriteFile(path, blob)
}

// WriteFile replaces the file at path with blob atomically (readable by
// its owner only, as the kubelet's checkpoints).
func WriteFile(path string, blob []byte) error {
	if err := fileutil.WriteCheckpoint(path, blob, 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// Devices returns every device ID in d once, in no particular order.
func (d DevicesPerNUMA) Devices() []string {
	seen := make(map[string]struct{})
	var out []string
	for _, ids := range d {
		for _, id := range ids {
			if _, ok := seen[id]; !ok {
				seen[id] = struct{}{}
				out = append(out, id)
			}
		}
	}
	return out
}
