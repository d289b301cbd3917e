package numa

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestReadNode(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, content string) string {
		dir := filepath.Join(root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	pci := write("devices/pci0000:80/0000:80:01.0", "1\n")
	usb := write("devices/pci0000:80/0000:80:01.0/usb1/1-1", "")
	noNUMA := write("devices/pci0000:00/0000:00:02.0", "-1\n")
	junk := write("devices/junk", "x\n")
	for _, tc := range []struct {
		name string
		got  int
		want int
	}{
		{"pci device", ReadNode(pci), 1},
		{"host without NUMA", ReadNode(noNUMA), None},
		{"junk", ReadNode(junk), None},
		{"missing file", ReadNode(usb), None},
		{"USB takes its controller's node", NodeOfSysPath(usb, root), 1},
		{"stops at the root", NodeOfSysPath(filepath.Join(root, "devices"), root), None},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	if !slices.Equal(Nodes(1), []int64{1}) || Nodes(None) != nil {
		t.Errorf("Nodes: %v %v", Nodes(1), Nodes(None))
	}
}
