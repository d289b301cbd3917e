package noderun

import (
	"fmt"
	"log/slog"
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

// The --inotify-limit modes.
const (
	// InotifyCheck refuses a --count the limit cannot hold.
	InotifyCheck = "check"
	// InotifyRaise raises the limit to what --count needs, then runs.
	InotifyRaise = "raise"
	// InotifyRaiseOnly raises the limit and exits: what a privileged init
	// container runs before the unprivileged node.
	InotifyRaiseOnly = "raise-only"
)

// inotifyHeadroom is what a raised limit leaves beyond what the nodes
// need and what is in use: the user's other processes.
const inotifyHeadroom = 128

// checkInotify refuses to start more nodes than the user's inotify
// instances allow: without it, the nodes past the limit fail one by one
// with "too many open files". It reads the limit and counts the instances
// the processes it can see hold; where either cannot be read it says
// nothing. With --inotify-limit raise or raise-only it writes a limit that
// holds them instead (the sysctl is the host's: a container needs to be
// privileged), and says so on log.
func checkInotify(o Options, limitPath, procDir string, log *slog.Logger) error {
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
	if o.InotifyLimit == InotifyRaise || o.InotifyLimit == InotifyRaiseOnly {
		raised := need + used + inotifyHeadroom
		if err := os.WriteFile(limitPath, []byte(strconv.Itoa(raised)+"\n"), 0o644); err != nil {
			return fmt.Errorf("--inotify-limit %s: --count %d needs %d inotify instances and fs.inotify.max_user_instances is %d, which this process cannot raise: %w (in a container, run the raise-only step privileged, or set the sysctl on the host)", o.InotifyLimit, o.Count, need, limit, err)
		}
		log.Info("Raised fs.inotify.max_user_instances", "from", limit, "to", raised, "nodes", o.Count)
		return nil
	}
	return fmt.Errorf("--count %d needs %d inotify instances (%d per node: its plugin watcher%s), and fs.inotify.max_user_instances is %d with %d in use: raise it, e.g. sysctl -w fs.inotify.max_user_instances=%d, or pass --inotify-limit raise, or run fewer nodes per process",
		o.Count, need, o.inotifyPerNode(), map[bool]string{true: " and its in-process plugin", false: ""}[o.PluginConfig != ""], limit, used, need+used+inotifyHeadroom)
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
