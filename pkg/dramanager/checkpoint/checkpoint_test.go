package checkpoint

import (
	"encoding/json"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// golden is the data of testdata/kubelet-v1.37.json, a file written by the
// kubelet v1.37 checkpointer (pkg/kubelet/cm/dra/state). Regenerate it
// with: (cd hack/tools && go run ./cmd/kubelet-dracheckpoint DIR) and copy
// DIR/dra_manager_state.
func golden() []ClaimState {
	share := "5ba3c8a4-0b7e-4e5a-9d1c-3f2b1a0c9e8d"
	return []ClaimState{
		{
			ClaimUID:  "a4f3b2c1-1111-4222-8333-444455556666",
			ClaimName: "gpu-claim",
			Namespace: "default",
			PodUIDs:   NewPodSet("pod-b", "pod-a"),
			DriverState: map[string]DriverState{
				"gpu.example.com": {Devices: []Device{
					{PoolName: "node-1", DeviceName: "gpu-0", RequestNames: []string{"gpus"}, CDIDeviceIDs: []string{"example.com/gpu=gpu-0"}},
					{PoolName: "node-1", DeviceName: "gpu-1", RequestNames: []string{"gpus"}, CDIDeviceIDs: []string{"example.com/gpu=gpu-1", "example.com/gpu=common"}},
				}},
				"nic.example.com": {Devices: []Device{
					{PoolName: "node-1", DeviceName: "vf-3", ShareID: &share, RequestNames: []string{"nic"}},
				}},
			},
		},
		{
			ClaimUID:  "b5e4c3d2-2222-4333-8444-555566667777",
			ClaimName: "pending-claim",
			Namespace: "team-a",
			PodUIDs:   NewPodSet("pod-c"),
			DriverState: map[string]DriverState{
				"gpu.example.com":  {},
				"skip.example.com": {SkipNodeOperations: []string{SkipAll}},
			},
		},
	}
}

func TestReadKubeletFile(t *testing.T) {
	t.Parallel()
	got, err := Read(filepath.Join("testdata", "kubelet-v1.37.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, golden()) {
		t.Fatalf("Read = %#v\nwant %#v", got, golden())
	}
}

func TestMarshalIsKubeletBytes(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(filepath.Join("testdata", "kubelet-v1.37.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Reversed, to show the order claims come in does not matter.
	in := golden()
	in[0], in[1] = in[1], in[0]
	got, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("Marshal differs from the kubelet's bytes:\n got %s\nwant %s", got, want)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), FileName)
	if _, err := Read(path); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read of a missing file = %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		name string
		in   []ClaimState
	}{
		{"empty", nil},
		{"golden", golden()},
	} {
		if err := Write(path, tc.in); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := Read(path)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(got) != len(tc.in) || (len(tc.in) > 0 && !reflect.DeepEqual(got, tc.in)) {
			t.Fatalf("%s: round trip = %#v, want %#v", tc.name, got, tc.in)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want 0600", tc.name, fi.Mode().Perm())
		}
	}
}

func TestUnmarshalRefuses(t *testing.T) {
	t.Parallel()
	good, err := Marshal(golden())
	if err != nil {
		t.Fatal(err)
	}
	var corrupt *CorruptError
	for _, tc := range []struct {
		name string
		blob []byte
		is   func(error) bool
	}{
		{"checksum", []byte(`{"Data":"{}","Checksum":1}`), func(err error) bool { return errors.As(err, &corrupt) }},
		{"trailing data", append(append([]byte{}, good...), []byte(` {}`)...), nil},
		{"not JSON", []byte(`not json`), nil},
		{"other kind", mustFile(t, `{"kind":"CPUCheckpoint","ClaimInfoStateList":null}`), nil},
	} {
		_, err := Unmarshal(tc.blob)
		if err == nil {
			t.Errorf("%s: Unmarshal accepted %s", tc.name, tc.blob)
			continue
		}
		if tc.is != nil && !tc.is(err) {
			t.Errorf("%s: error %v is not the expected kind", tc.name, err)
		}
	}
}

// mustFile wraps inner as a checkpoint file with the right checksum.
func mustFile(t *testing.T, inner string) []byte {
	t.Helper()
	blob, err := json.Marshal(file{Data: inner, Checksum: crc32.ChecksumIEEE([]byte(inner))})
	if err != nil {
		t.Fatal(err)
	}
	return blob
}
