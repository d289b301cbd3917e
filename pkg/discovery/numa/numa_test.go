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

func TestReadNodes(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	nodes := filepath.Join(root, NodesDir)
	if err := os.MkdirAll(nodes, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"node10", "node1", "node0", "nodex", "node01", "power"} {
		if err := os.Mkdir(filepath.Join(nodes, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// Files beside the node directories, one of them named like a node.
	for _, f := range []string{"possible", "online", "node7"} {
		if err := os.WriteFile(filepath.Join(nodes, f), []byte("0-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadNodes(root)
	if err != nil || !slices.Equal(got, []int{0, 1, 10}) {
		t.Errorf("ReadNodes = %v, %v; want [0 1 10]", got, err)
	}
	if got, err := ReadNodes(t.TempDir()); err != nil || got != nil {
		t.Errorf("ReadNodes without NUMA = %v, %v; want none", got, err)
	}
}
