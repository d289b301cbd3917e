package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// hostShareDir is where the real nodes running on one machine (a `go test
// ./...` runs packages in parallel) agree on what they share: the pod
// subnet each one uses, and the sysctls the first saved and the last
// restores. It is on /run, so a reboot clears it.
const hostShareDir = "/run/dpkit-test-node"

// hostShare is one node's entry: the test process that runs it (a crashed
// process's entry is dropped by the next node) and its subnet slot.
type hostShare struct {
	PID  int `json:"pid"`
	Slot int `json:"slot"`
}

// withHostLock runs f holding the machine-wide lock.
func withHostLock(f func() error) error {
	if err := os.MkdirAll(filepath.Join(hostShareDir, "nodes"), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(hostShareDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing the file unlocks too
	return f()
}

// liveShares returns the entries of running nodes, removing those whose
// process is gone.
func liveShares() (map[string]hostShare, error) {
	dir := filepath.Join(hostShareDir, "nodes")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]hostShare{}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var s hostShare
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil || s.PID <= 0 || errors.Is(syscall.Kill(s.PID, 0), syscall.ESRCH) {
			_ = os.Remove(p)
			continue
		}
		out[e.Name()] = s
	}
	return out, nil
}

// joinHost registers the node: it takes the lowest free subnet slot and,
// when it is the only node, saves the sysctls (a later node finds them
// already changed by the first one's kubelet, so only the first saves).
func (n *Node) joinHost() error {
	return withHostLock(func() error {
		live, err := liveShares()
		if err != nil {
			return err
		}
		used := map[int]bool{}
		for _, s := range live {
			used[s.Slot] = true
		}
		slot := 0
		for used[slot] {
			slot++
		}
		if slot > 255 {
			return errors.New("256 real nodes already run on this machine")
		}
		saved := filepath.Join(hostShareDir, "sysctls.json")
		if len(live) == 0 {
			vals, err := readSysctls()
			if err != nil {
				return err
			}
			b, _ := json.Marshal(vals)
			if err := os.WriteFile(saved, b, 0o644); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(saved)
		if err != nil {
			return fmt.Errorf("read the sysctls saved by the first node: %w", err)
		}
		if err := json.Unmarshal(b, &n.impl.sysctls); err != nil {
			return fmt.Errorf("%s: %w", saved, err)
		}
		entry, _ := json.Marshal(hostShare{PID: os.Getpid(), Slot: slot})
		n.impl.shareName = filepath.Base(filepath.Dir(n.Dir))
		if err := os.WriteFile(filepath.Join(hostShareDir, "nodes", n.impl.shareName), entry, 0o644); err != nil {
			return err
		}
		n.PodSubnet = "10.244." + strconv.Itoa(slot) + ".0/24"
		return nil
	})
}

// leaveHost removes the node's entry; the last node restores the sysctls.
func (n *Node) leaveHost() error {
	if n.impl.shareName == "" {
		return nil
	}
	return withHostLock(func() error {
		_ = os.Remove(filepath.Join(hostShareDir, "nodes", n.impl.shareName))
		live, err := liveShares()
		if err != nil {
			return err
		}
		if len(live) > 0 {
			n.impl.logger.Info("Other real nodes still run on this machine; the last one restores the sysctls", "nodes", len(live))
			return nil
		}
		if err := n.impl.restoreSysctls(); err != nil {
			return err
		}
		return os.Remove(filepath.Join(hostShareDir, "sysctls.json"))
	})
}
