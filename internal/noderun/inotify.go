package noderun

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// inotifyLimit is where Linux keeps the number of inotify watches a user
// may hold. The nodes of a process share one inotify instance
// (internal/fswatch), so instances are no limit; each node adds watches.
const inotifyLimit = "/proc/sys/fs/inotify/max_user_watches"

// inotifyPerNode is the watches one node adds: its plugin directory,
// which its plugin watcher and its in-process plugins' sockets share.
const inotifyPerNode = 1

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
const inotifyHeadroom = 1024

// checkInotify refuses to start more nodes than the user's inotify
// watches allow: without it, the nodes past the limit fail one by one
// with "no space left on device". It reads the limit and counts the
// watches the processes it can see hold; where either cannot be read it
// says nothing. With --inotify-limit raise or raise-only it writes a
// limit that holds them instead (the sysctl is the host's: a container
// needs to be privileged), and says so on log.
func checkInotify(o Options, limitPath, procDir string, log *slog.Logger) error {
	data, err := os.ReadFile(limitPath)
	if err != nil {
		return nil
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return nil
	}
	need := o.Count * inotifyPerNode
	used := inotifyInUse(procDir)
	if need+used <= limit {
		return nil
	}
	if o.InotifyLimit == InotifyRaise || o.InotifyLimit == InotifyRaiseOnly {
		raised := need + used + inotifyHeadroom
		if err := os.WriteFile(limitPath, []byte(strconv.Itoa(raised)+"\n"), 0o644); err != nil {
			return fmt.Errorf("--inotify-limit %s: --count %d needs %d inotify watches and fs.inotify.max_user_watches is %d, which this process cannot raise: %w (in a container, run the raise-only step privileged, or set the sysctl on the host)", o.InotifyLimit, o.Count, need, limit, err)
		}
		log.Info("Raised fs.inotify.max_user_watches", "from", limit, "to", raised, "nodes", o.Count)
		return nil
	}
	return fmt.Errorf("--count %d needs %d inotify watches (%d per node: its plugin directory), and fs.inotify.max_user_watches is %d with %d in use: raise it, e.g. sysctl -w fs.inotify.max_user_watches=%d, or pass --inotify-limit raise, or run fewer nodes per process",
		o.Count, need, inotifyPerNode, limit, used, need+used+inotifyHeadroom)
}

// inotifyInUse counts the inotify watches of the processes in procDir
// whose file descriptors can be read: the "inotify wd:" lines of each
// inotify instance's fdinfo.
func inotifyInUse(procDir string) int {
	fds, _ := filepath.Glob(filepath.Join(procDir, "[0-9]*", "fd", "*"))
	n := 0
	for _, fd := range fds {
		if t, err := os.Readlink(fd); err != nil || t != "anon_inode:inotify" {
			continue
		}
		info := filepath.Join(filepath.Dir(filepath.Dir(fd)), "fdinfo", filepath.Base(fd))
		data, err := os.ReadFile(info)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(line, "inotify wd:") {
				n++
			}
		}
	}
	return n
}
