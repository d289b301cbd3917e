package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"

	"k8s.io/utils/dump"
)

// referenceChecksum is the kubelet's checksum, computed as the kubelet
// computes it (hashutil.DeepHashObject).
func referenceChecksum(d checkpointData) uint64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(d))
	return uint64(h.Sum32())
}

// referenceMarshal is the kubelet's MarshalCheckpoint: encoding/json over
// the data, nil written as empty, with the reference checksum.
func referenceMarshal(cp Checkpoint) []byte {
	d := checkpointData{PodDeviceEntries: cp.Entries, RegisteredDevices: cp.Registered}
	if d.PodDeviceEntries == nil {
		d.PodDeviceEntries = []PodDevicesEntry{}
	}
	if d.RegisteredDevices == nil {
		d.RegisteredDevices = map[string][]string{}
	}
	b, err := json.Marshal(file{Data: d, Checksum: referenceChecksum(d)})
	if err != nil {
		panic(err)
	}
	return b
}

// Pieces that need escaping in JSON, or that spew could print otherwise.
var pieces = []string{"", "a", "dev-0", "example.com/gpu", `"`, `\`, "<", ">", "&", "\n", "\t", "\x00", "\x1f", "\x7f",
	"\b", "\f", "é", "\u2028", "\u2029", "\xff", "\xc3", " ", ":", "[", "]", "{", "}", "<nil>", "map[", "日本"}

func randString(r *rand.Rand) string {
	var s string
	for range r.IntN(4) {
		s += pieces[r.IntN(len(pieces))]
	}
	return s
}

func randStrings(r *rand.Rand) []string {
	switch r.IntN(5) {
	case 0:
		return nil
	case 1:
		return []string{}
	}
	out := make([]string, 1+r.IntN(4))
	for i := range out {
		out[i] = randString(r)
	}
	return out
}

func randCheckpoint(r *rand.Rand) Checkpoint {
	var cp Checkpoint
	if r.IntN(6) > 0 {
		cp.Entries = make([]PodDevicesEntry, r.IntN(6))
		for i := range cp.Entries {
			e := PodDevicesEntry{PodUID: randString(r), ContainerName: randString(r), ResourceName: randString(r)}
			if r.IntN(5) > 0 {
				e.DeviceIDs = DevicesPerNUMA{}
				for range r.IntN(5) {
					keys := []int64{-1, 0, 1, 2, 10, 11, -12, 1 << 40, -1 << 62}
					e.DeviceIDs[keys[r.IntN(len(keys))]] = randStrings(r)
				}
			}
			switch r.IntN(4) {
			case 0:
			case 1:
				e.AllocResp = []byte{}
			default:
				e.AllocResp = make([]byte, r.IntN(300))
				for j := range e.AllocResp {
					e.AllocResp[j] = byte(r.IntN(256))
				}
			}
			cp.Entries[i] = e
		}
	}
	if r.IntN(6) > 0 {
		cp.Registered = map[string][]string{}
		for range r.IntN(5) {
			cp.Registered[randString(r)] = randStrings(r)
		}
	}
	return cp
}

// TestEncodersMatchReference holds the direct encoders to encoding/json and
// go-spew: the same bytes in the file and the same checksum, on data with
// every kind of string, nil and empty values and NUMA keys whose text and
// numeric orders differ.
func TestEncodersMatchReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	cases := []Checkpoint{{}, golden(), {Entries: []PodDevicesEntry{}, Registered: map[string][]string{}}}
	for range 3000 {
		cases = append(cases, randCheckpoint(r))
	}
	for i, cp := range cases {
		checkSame(t, fmt.Sprint("case ", i), cp)
	}
}

func checkSame(t *testing.T, name string, cp Checkpoint) {
	t.Helper()
	want := referenceMarshal(cp)
	got, err := Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: Marshal differs from encoding/json + go-spew:\n got %q\nwant %q", name, got, want)
	}
	d := checkpointData{PodDeviceEntries: cp.Entries, RegisteredDevices: cp.Registered}
	if got, want := Checksum(cp), referenceChecksum(d); got != want {
		t.Fatalf("%s: Checksum = %d, go-spew's = %d (data %#v)", name, got, want, d)
	}
	// What is read back (empty []byte rather than nil, invalid UTF-8
	// replaced) hashes the same both ways too, and Unmarshal refuses the
	// file exactly when the kubelet would.
	var f file
	if err := json.Unmarshal(got, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want2 := referenceChecksum(f.Data)
	if got2 := checksum(f.Data); got2 != want2 {
		t.Fatalf("%s: checksum of the decoded data = %d, go-spew's = %d", name, got2, want2)
	}
	_, err = Unmarshal(got)
	if (err != nil) != (f.Checksum != want2) {
		t.Fatalf("%s: Unmarshal = %v, but the kubelet's checksum says corrupt=%v", name, err, f.Checksum != want2)
	}
}

func FuzzEncoders(f *testing.F) {
	f.Add("pod", "ctr", "example.com/gpu", int64(0), "dev-0", []byte{1, 2}, "example.com/gpu")
	f.Add("<\u2028>", "\xff", "&", int64(-1), "\"\\", []byte{}, "\x00")
	f.Fuzz(func(t *testing.T, uid, ctr, res string, numa int64, id string, resp []byte, reg string) {
		cp := Checkpoint{
			Entries:    []PodDevicesEntry{{PodUID: uid, ContainerName: ctr, ResourceName: res, DeviceIDs: DevicesPerNUMA{numa: {id, id}, 3: {}}, AllocResp: resp}},
			Registered: map[string][]string{reg: {id}, "": nil},
		}
		checkSame(t, "fuzz", cp)
	})
}

// BenchmarkMarshal is one checkpoint write's encoding on a node with 100
// containers holding a device each: all of it (Marshal), and what the
// device manager encodes with its kept entries (MarshalEntries).
func BenchmarkMarshal(b *testing.B) {
	var cp Checkpoint
	cp.Registered = map[string][]string{"example.com/dev": {}}
	for i := range 100 {
		id := fmt.Sprintf("dev-%d", i)
		cp.Registered["example.com/dev"] = append(cp.Registered["example.com/dev"], id)
		cp.Entries = append(cp.Entries, PodDevicesEntry{
			PodUID: fmt.Sprintf("0b8c6c2e-5d6f-4a4e-9d3c-%012d", i), ContainerName: "main", ResourceName: "example.com/dev",
			DeviceIDs: DevicesPerNUMA{-1: {id}}, AllocResp: bytes.Repeat([]byte{0x0a, 0x10}, 60),
		})
	}
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = referenceMarshal(cp)
		}
	})
	b.Run("Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Marshal(cp)
		}
	})
	entries := encodeAll(cp.Entries)
	b.Run("MarshalEntries", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = MarshalEntries(entries, cp.Registered)
		}
	})
}
