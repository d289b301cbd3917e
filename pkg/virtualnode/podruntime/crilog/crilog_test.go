package crilog

import "testing"

func FuzzParseLine(f *testing.F) {
	f.Add([]byte("2026-01-01T00:00:00.000000001Z stdout F hello"))
	f.Add([]byte("2026-01-01T00:00:00Z stderr P"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, line []byte) {
		l, ok := parseLine(line)
		if ok && len(l.msg) > len(line) {
			t.Fatalf("message longer than the line")
		}
	})
}
