package noderun

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// inotifyLimit is where Linux keeps the number of inotify instances a user
// may hold.
const inotifyLimit = "/proc/sys/fs/inotify/max_user_instances"

// inotifyPerNode is what one node holds: its plugin watcher, and the
// in-process plugin's watch of the kubelet socket.
func (o *Options) inotifyPerNode() int {
	if o.PluginConfig != "" {
		return 2
	}
	return 1
}

// checkInotify refuses to start more nodes than the user's inotify
// instances allow: without it, the nodes past the limit fail one by one
// with "too many open files". It reads the limit and counts the instances
// the processes it can see hold; where either cannot be read it says
// nothing.
func checkInotify(o Options, limitPath, procDir string) error {
	data, err := os.ReadFile(limitPath)
	if err != nil {
		return nil
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return nil
	}
	need := o.Count * o.inotifyPerNode()
	used := inotifyInUse(procDir)
	if need+used <= limit {
		return nil
	}
	return fmt.Errorf("--count %d needs %d inotify instances (%d per node: its plugin watcher%s), and fs.inotify.max_user_instances is %d with %d in use: raise it, e.g. sysctl -w fs.inotify.max_user_instances=%d, or run fewer nodes per process",
		o.Count, need, o.inotifyPerNode(), map[bool]string{true: " and its in-process plugin", false: ""}[o.PluginConfig != ""], limit, used, need+used+128)
}

// inotifyInUse counts the inotify instances of the processes in procDir
// whose file descriptors can be read.
func inotifyInUse(procDir string) int {
	fds, _ := filepath.Glob(filepath.Join(procDir, "[0-9]*", "fd", "*"))
	n := 0
	for _, fd := range fds {
		if t, err := os.Readlink(fd); err == nil && t == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
