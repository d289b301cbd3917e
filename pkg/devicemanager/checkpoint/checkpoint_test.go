package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// golden is the data of testdata/kubelet-v1.37.json, a file written by the
// kubelet v1.37 checkpoint package (checkpoint.New(...).MarshalCheckpoint()).
func golden() Checkpoint {
	return Checkpoint{
		Entries: []PodDevicesEntry{
			{PodUID: "pod-uid-1", ContainerName: "ctr", ResourceName: "example.com/gpu",
				DeviceIDs: DevicesPerNUMA{0: {"dev-0", "dev-1"}, 1: {"dev-2"}}, AllocResp: []byte{0x12, 0x04, 0x0a, 0x02, 0x41, 0x42}},
			{PodUID: "pod-uid-2", ContainerName: "init", ResourceName: "example.com/nic",
				DeviceIDs: DevicesPerNUMA{-1: {"nic-a"}}},
		},
		Registered: map[string][]string{
			"example.com/gpu":   {"dev-0", "dev-1", "dev-2", "dev-3"},
			"example.com/nic":   {"nic-a"},
			"example.com/empty": {},
		},
	}
}

func TestReadKubeletCheckpoint(t *testing.T) {
	t.Parallel()
	cp, err := Read(filepath.Join("testdata", "kubelet-v1.37.json"))
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if !reflect.DeepEqual(cp, golden()) {
		t.Fatalf("Read = %#v\nwant %#v", cp, golden())
	}
}

func TestMarshalMatchesKubelet(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(filepath.Join("testdata", "kubelet-v1.37.json"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Marshal(golden())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from the kubelet's encoding:\n got %s\nwant %s", got, want)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if _, err := Read(path); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read of missing file = %v, want ErrNotFound", err)
	}
	tests := []struct {
		name string
		cp   Checkpoint
		want Checkpoint
	}{
		{"empty", Checkpoint{}, Checkpoint{Entries: []PodDevicesEntry{}, Registered: map[string][]string{}}},
		{"golden", golden(), golden()},
	}
	for _, tc := range tests {
		if err := Write(path, tc.cp); err != nil {
			t.Fatalf("%s: Write: %v", tc.name, err)
		}
		got, err := Read(path)
		if err != nil {
			t.Fatalf("%s: Read: %v", tc.name, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("%s: got %#v, want %#v", tc.name, got, tc.want)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	t.Parallel()
	good, err := Marshal(golden())
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(good, []byte("dev-3"), []byte("dev-9"), 1)
	tests := []struct {
		name    string
		blob    []byte
		corrupt bool
	}{
		{"not json", []byte("not json"), false},
		{"trailing data", append(append([]byte{}, good...), []byte(" {}")...), false},
		{"tampered data", tampered, true},
		{"wrong checksum", bytes.Replace(good, []byte(`"Checksum":`), []byte(`"Checksum":1`), 1), true},
		{"foreign json", []byte(`{"policyName":"none","defaultCpuSet":"","checksum":1}`), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Unmarshal(tc.blob)
			if err == nil {
				t.Fatal("Unmarshal accepted bad input")
			}
			var ce *CorruptError
			if got := errors.As(err, &ce); got != tc.corrupt {
				t.Fatalf("corrupt = %v, want %v (%v)", got, tc.corrupt, err)
			}
		})
	}
}

func FuzzUnmarshal(f *testing.F) {
	good, err := Marshal(golden())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, blob []byte) {
		cp, err := Unmarshal(blob)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same value.
		again, err := Marshal(cp)
		if err != nil {
			t.Fatalf("Marshal of decoded checkpoint: %v", err)
		}
		cp2, err := Unmarshal(again)
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if Checksum(cp2) != Checksum(normalize(cp)) {
			t.Fatalf("checksum changed across a round trip")
		}
	})
}

func normalize(cp Checkpoint) Checkpoint {
	if cp.Entries == nil {
		cp.Entries = []PodDevicesEntry{}
	}
	if cp.Registered == nil {
		cp.Registered = map[string][]string{}
	}
	return cp
}
