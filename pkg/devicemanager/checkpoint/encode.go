package checkpoint

import (
	"encoding/base64"
	"encoding/json"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The kubelet writes the checkpoint after every admission, every removal
// and every ListAndWatch message, and each write encodes everything: the
// JSON of the file and, for its checksum, go-spew's text of the data. With
// encoding/json and go-spew that is reflection over every byte of every
// Allocate answer (spew prints a []byte as decimal numbers, one reflect
// call each), so a node admitting pods spent a third of its CPU here.
//
// The encoders below write the same bytes directly. An assignment never
// changes once made, so the device manager keeps each one's encodings in an
// Entry and a write only encodes what is new. TestEncodersMatchReference
// and FuzzEncoders hold them to encoding/json and k8s.io/utils/dump.

// Entry is a PodDevicesEntry with its two encodings, computed once.
type Entry struct {
	PodDevicesEntry
	json []byte // the entry's JSON, as encoding/json writes it
	spew []byte // the entry's text in the checksum, as an element of the slice
}

// NewEntry encodes e. e must not change afterwards.
func NewEntry(e PodDevicesEntry) *Entry {
	return &Entry{PodDevicesEntry: e, json: appendEntryJSON(nil, e), spew: appendEntrySpew(nil, e)}
}

// MarshalEntries is Marshal for encoded entries: the same bytes, without
// encoding the entries again.
func MarshalEntries(entries []*Entry, registered map[string][]string) []byte {
	// Like Marshal, nil is written as empty, and hashed so.
	if registered == nil {
		registered = map[string][]string{}
	}
	sum := spewChecksum(entries, false, registered)
	n := 64
	for _, e := range entries {
		n += len(e.json) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"Data":{"PodDeviceEntries":[`...)
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e.json...)
	}
	b = append(b, `],"RegisteredDevices":`...)
	b = appendStringSlicesJSON(b, registered)
	b = append(b, `},"Checksum":`...)
	b = strconv.AppendUint(b, sum, 10)
	return append(b, '}')
}

func encodeAll(entries []PodDevicesEntry) []*Entry {
	out := make([]*Entry, len(entries))
	for i, e := range entries {
		out[i] = NewEntry(e)
	}
	return out
}

// spewChecksum is the kubelet's checksum of a checkpointData: FNV-32a over
// go-spew's "%#v" with dump.ForHash's configuration. entriesNil tells a nil
// slice (printed <nil>) from an empty one.
func spewChecksum(entries []*Entry, entriesNil bool, registered map[string][]string) uint64 {
	h := fnv.New32a()
	var buf []byte
	buf = append(buf, "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"...)
	if entriesNil {
		buf = append(buf, "<nil>"...)
	} else {
		buf = append(buf, '[')
		for i, e := range entries {
			if i > 0 {
				buf = append(buf, ' ')
			}
			_, _ = h.Write(buf)
			buf = buf[:0]
			_, _ = h.Write(e.spew)
		}
		buf = append(buf, ']')
	}
	buf = append(buf, " RegisteredDevices:(map[string][]string)"...)
	if registered == nil {
		buf = append(buf, "<nil>"...)
	} else {
		buf = append(buf, "map["...)
		for i, k := range slices.Sorted(maps.Keys(registered)) {
			if i > 0 {
				buf = append(buf, ' ')
			}
			buf = append(buf, k...)
			buf = append(buf, ':')
			buf = appendStringsSpew(buf, registered[k])
			if len(buf) > 32<<10 {
				_, _ = h.Write(buf)
				buf = buf[:0]
			}
		}
		buf = append(buf, ']')
	}
	buf = append(buf, '}')
	_, _ = h.Write(buf)
	return uint64(h.Sum32())
}

// appendEntrySpew writes e as go-spew prints an element of a
// []PodDevicesEntry: no type before the struct, each field's type before
// its value.
func appendEntrySpew(b []byte, e PodDevicesEntry) []byte {
	b = append(b, "{PodUID:(string)"...)
	b = append(b, e.PodUID...)
	b = append(b, " ContainerName:(string)"...)
	b = append(b, e.ContainerName...)
	b = append(b, " ResourceName:(string)"...)
	b = append(b, e.ResourceName...)
	b = append(b, " DeviceIDs:(checkpoint.DevicesPerNUMA)"...)
	if e.DeviceIDs == nil {
		b = append(b, "<nil>"...)
	} else {
		// SortKeys: integer keys in numeric order.
		b = append(b, "map["...)
		for i, k := range slices.Sorted(maps.Keys(e.DeviceIDs)) {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, k, 10)
			b = append(b, ':')
			b = appendStringsSpew(b, e.DeviceIDs[k])
		}
		b = append(b, ']')
	}
	b = append(b, " AllocResp:([]uint8)"...)
	if e.AllocResp == nil {
		b = append(b, "<nil>"...)
	} else {
		b = append(b, '[')
		for i, c := range e.AllocResp {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendUint(b, uint64(c), 10)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendStringsSpew writes a []string that is a map value: no type, nil
// as <nil>, strings as they are.
func appendStringsSpew(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "<nil>"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, s...)
	}
	return append(b, ']')
}

// appendEntryJSON writes e as encoding/json does.
func appendEntryJSON(b []byte, e PodDevicesEntry) []byte {
	b = append(b, `{"PodUID":`...)
	b = appendStringJSON(b, e.PodUID)
	b = append(b, `,"ContainerName":`...)
	b = appendStringJSON(b, e.ContainerName)
	b = append(b, `,"ResourceName":`...)
	b = appendStringJSON(b, e.ResourceName)
	b = append(b, `,"DeviceIDs":`...)
	if e.DeviceIDs == nil {
		b = append(b, "null"...)
	} else {
		// encoding/json sorts map keys by their text: "-1" < "1" < "10" < "2".
		type key struct {
			text string
			n    int64
		}
		keys := make([]key, 0, len(e.DeviceIDs))
		for n := range e.DeviceIDs {
			keys = append(keys, key{strconv.FormatInt(n, 10), n})
		}
		slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.text, b.text) })
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, k.text...)
			b = append(b, `":`...)
			b = appendStringsJSON(b, e.DeviceIDs[k.n])
		}
		b = append(b, '}')
	}
	b = append(b, `,"AllocResp":`...)
	if e.AllocResp == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, e.AllocResp)
		b = append(b, '"')
	}
	return append(b, '}')
}

func appendStringSlicesJSON(b []byte, m map[string][]string) []byte {
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendStringJSON(b, k)
		b = append(b, ':')
		b = appendStringsJSON(b, m[k])
	}
	return append(b, '}')
}

func appendStringsJSON(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendStringJSON(b, s)
	}
	return append(b, ']')
}

// appendStringJSON writes s as encoding/json does. Printable ASCII that
// needs no escaping (IDs, names, UIDs) is written as it is; anything else
// is left to encoding/json, which knows its rules for HTML characters,
// control characters, U+2028/U+2029 and invalid UTF-8.
func appendStringJSON(b []byte, s string) []byte {
	if plainJSON(s) {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || strings.IndexByte(`"\<>&`, c) >= 0 {
			return false
		}
	}
	return true
}
