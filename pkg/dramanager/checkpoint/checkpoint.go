// Package checkpoint reads and writes the DRA manager's checkpoint
// (<kubelet root>/dra_manager_state) in the kubelet's format, so a kubelet
// can read what dpkit writes and dpkit can read what a kubelet wrote.
//
// The file is the JSON encoding of
//
//	{"Data": "<JSON text>", "Checksum": N}
//
// where the Data string is the JSON encoding of
//
//	{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1",
//	 "ClaimInfoStateList":[{ClaimUID, ClaimName, Namespace, PodUIDs, DriverState}]}
//
// and N the CRC-32 (IEEE) of that string's bytes. PodUIDs is a set, written
// as an object whose keys are the pod UIDs and whose values are {}.
// Field names and order follow the kubelet's types
// (pkg/kubelet/cm/dra/state, v1.37): changing them changes the bytes.
package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"strings"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// FileName is the checkpoint's file name in the kubelet root.
const FileName = "dra_manager_state"

// Kind and APIVersion identify the checkpoint's data.
const (
	Kind       = "DRACheckpoint"
	APIVersion = "checkpoint.dra.kubelet.k8s.io/v1"
)

// SkipAll is the SkipNodeOperations value that skips every node operation
// (resource.k8s.io/v1 SkipNodeOperationAll).
const SkipAll = "*"

// ClaimState is what the node knows of one prepared (or being prepared)
// ResourceClaim: which pods use it and, per driver, the devices the
// driver prepared.
type ClaimState struct {
	ClaimUID    string
	ClaimName   string
	Namespace   string
	PodUIDs     PodSet
	DriverState map[string]DriverState
}

// DriverState is one driver's part of a claim.
type DriverState struct {
	Devices []Device
	// SkipNodeOperations lists the node operations (NodePrepareResources,
	// NodeUnprepareResources, or SkipAll) the driver's devices in the
	// claim all skip (DRAOptionalNodeOperations).
	SkipNodeOperations []string `json:"skipNodeOperations,omitempty"`
}

// Skips tells whether the driver skips op for this claim.
func (s DriverState) Skips(op string) bool {
	return slices.Contains(s.SkipNodeOperations, SkipAll) || slices.Contains(s.SkipNodeOperations, op)
}

// Device is one device a driver prepared for a claim.
type Device struct {
	PoolName     string
	DeviceName   string
	ShareID      *string
	RequestNames []string
	CDIDeviceIDs []string
}

// PodSet is a set of pod UIDs. It encodes as the kubelet's
// sets.Set[string]: a JSON object with the UIDs as keys (sorted) and {}
// as values.
type PodSet map[string]struct{}

// NewPodSet returns a set holding uids.
func NewPodSet(uids ...string) PodSet {
	s := make(PodSet, len(uids))
	for _, u := range uids {
		s[u] = struct{}{}
	}
	return s
}

// Has tells whether uid is in s.
func (s PodSet) Has(uid string) bool { _, ok := s[uid]; return ok }

// Sorted returns the UIDs in s, sorted.
func (s PodSet) Sorted() []string {
	out := make([]string, 0, len(s))
	for u := range s {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

type data struct {
	Kind               string       `json:"kind,omitempty"`
	APIVersion         string       `json:"apiVersion,omitempty"`
	ClaimInfoStateList []ClaimState `json:"ClaimInfoStateList"`
}

type file struct {
	Data     string
	Checksum uint32
}

// ErrNotFound is returned by Read when there is no checkpoint file.
var ErrNotFound = errors.New("checkpoint not found")

// CorruptError reports a checkpoint whose checksum does not match its data.
type CorruptError struct {
	Expected, Actual uint32
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint is corrupted: checksum %d in the file, %d computed from its data", e.Expected, e.Actual)
}

// Marshal encodes claims as the kubelet does. The kubelet writes claims
// in its map's order; Marshal writes them sorted by namespace and name,
// so the same state always gives the same bytes.
func Marshal(claims []ClaimState) ([]byte, error) {
	claims = slices.Clone(claims)
	slices.SortFunc(claims, func(a, b ClaimState) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.ClaimName, b.ClaimName)
	})
	inner, err := json.Marshal(data{Kind: Kind, APIVersion: APIVersion, ClaimInfoStateList: claims})
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return json.Marshal(file{Data: string(inner), Checksum: crc32.ChecksumIEEE(inner)})
}

// Unmarshal decodes a checkpoint and verifies its checksum and kind. It
// returns a *CorruptError when the checksum does not match.
func Unmarshal(blob []byte) ([]ClaimState, error) {
	var f file
	dec := json.NewDecoder(bytes.NewReader(blob))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode checkpoint: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode checkpoint: trailing data after the JSON object")
	}
	if got := crc32.ChecksumIEEE([]byte(f.Data)); got != f.Checksum {
		return nil, &CorruptError{Expected: f.Checksum, Actual: got}
	}
	var d data
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil {
		return nil, fmt.Errorf("decode checkpoint data: %w", err)
	}
	// The kubelet does not check kind and apiVersion; an empty one is what
	// its first versions wrote, anything else is not this checkpoint.
	if (d.Kind != "" && d.Kind != Kind) || (d.APIVersion != "" && d.APIVersion != APIVersion) {
		return nil, fmt.Errorf("decode checkpoint data: kind %q apiVersion %q, want %q %q", d.Kind, d.APIVersion, Kind, APIVersion)
	}
	for i := range d.ClaimInfoStateList {
		if d.ClaimInfoStateList[i].PodUIDs == nil {
			d.ClaimInfoStateList[i].PodUIDs = PodSet{}
		}
	}
	return d.ClaimInfoStateList, nil
}

// Read reads and verifies the checkpoint at path. It returns ErrNotFound
// when the file does not exist.
func Read(path string) ([]ClaimState, error) {
	blob, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	claims, err := Unmarshal(blob)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return claims, nil
}

// Write encodes claims and replaces the file at path atomically, readable
// by its owner only as the kubelet's checkpoints.
func Write(path string, claims []ClaimState) error {
	blob, err := Marshal(claims)
	if err != nil {
		return err
	}
	if err := fileutil.WriteCheckpoint(path, blob, 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}
