package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dpkit/dpkit/internal/procfs"
)

// StopPods ends the containers of every pod recorded under dir (a
// Backend's Config.Dir) that still run. A Backend that closes leaves its
// pods' processes running, as a kubelet that stops leaves its containers,
// so that the next Backend on the same Dir adopts them; StopPods is for
// when no node will: a node taken out of service, a test ending. Call it
// only when no Backend runs on dir.
//
// Each container's process group gets SIGTERM, then SIGKILL once grace has
// passed; StopPods returns when they are gone, with the pods
// ("namespace/name") that had processes, or when ctx ends, with an error
// naming what still runs. A recorded process whose PID now belongs to
// another program (its start time differs) is left alone. The pods'
// directories are kept.
func StopPods(ctx context.Context, dir string, grace time.Duration) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("process backend: %w", err)
	}
	groups := map[int]string{} // process group -> pod
	var pods []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "state.json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var st state
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err != nil {
			return nil, fmt.Errorf("process backend: pod state %s: %w", filepath.Join(dir, e.Name(), "state.json"), err)
		}
		if st.Pod == nil {
			return nil, fmt.Errorf("process backend: pod state %s holds no pod", filepath.Join(dir, e.Name(), "state.json"))
		}
		name := st.Pod.Namespace + "/" + st.Pod.Name
		for _, ps := range st.Procs {
			if ticks, err := procStartTicks(ps.PID); err == nil && ticks != ps.StartTicks {
				continue // the PID is another program's now
			}
			// The leader may be gone while processes of its group run
			// on; the group's ID cannot be reused while they do.
			if len(groupMembers(ps.PID)) == 0 {
				continue
			}
			groups[ps.PID] = name
			if !slices.Contains(pods, name) {
				pods = append(pods, name)
			}
		}
	}
	if len(groups) == 0 {
		return nil, nil
	}
	for pgid := range groups {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
	}
	kill := time.NewTimer(grace)
	defer kill.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var left []string
		for pgid, pod := range groups {
			if m := groupMembers(pgid); len(m) > 0 {
				left = append(left, fmt.Sprintf("%s: process group %d (%v)", pod, pgid, m))
			} else {
				delete(groups, pgid)
			}
		}
		if len(left) == 0 {
			slices.Sort(pods)
			return pods, nil
		}
		select {
		case <-ctx.Done():
			slices.Sort(left)
			return pods, fmt.Errorf("process backend: still running: %s: %w", strings.Join(left, "; "), ctx.Err())
		case <-kill.C:
			for pgid := range groups {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		case <-tick.C:
		}
	}
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	for _, pid := range procfs.PIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && !st.Exited() && st.PGRP() == pgid {
			out = append(out, pid)
		}
	}
	return out
}
