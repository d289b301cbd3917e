package draverify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/internal/procfs"
)

// What tells a run that goes on from one that has ended: the run record
// in its temporary root, the owner annotation on its API objects and the
// run in its driver's environment. dpkit verify --dra --cleanup removes
// what runs that have ended left (cleanup.go).

const (
	// RunLabel is the label every object a run of verify --dra creates
	// on the API server carries, with the run's ID: clean-up deletes by
	// it, and nothing else.
	RunLabel = "dpkit.io/verify-run"
	// ownerAnnotation holds the owner of the run, as JSON, on the
	// Namespace and the Node of the run.
	ownerAnnotation = "dpkit.io/verify-owner"
	// envRun and envOwner are set to the run's ID and its owner (PID,
	// start and boot, as ownerEnv writes them) in the driver's
	// environment, which the processes it forks inherit.
	envRun   = "DPKIT_VERIFY_RUN"
	envOwner = "DPKIT_VERIFY_OWNER"
	// rootPrefix and the run's ID name a run's temporary root in the
	// temporary directory; rootPattern matches them (and those
	// os.MkdirTemp named before).
	rootPrefix  = "dpvd-"
	rootPattern = "dpvd*"
	// recordFile is the run record, in the run's root.
	recordFile = "dpkit-verify-run.json"
)

// owner is the verify process a run is: it runs as long as that process
// does.
type owner struct {
	Host string `json:"host"`
	// BootID tells one boot of Host from the next, where process IDs
	// start again.
	BootID string `json:"bootID,omitempty"`
	PID    int    `json:"pid"`
	// Start is when the process started, in clock ticks after boot
	// (/proc/PID/stat), which tells it from a later process given the
	// same ID.
	Start uint64 `json:"start,omitempty"`
}

// runRecord is what a run writes into its root for --cleanup.
type runRecord struct {
	Run       string    `json:"run"`
	Owner     owner     `json:"owner"`
	Started   time.Time `json:"started"`
	Node      string    `json:"node"`
	Namespace string    `json:"namespace"`
	// NodeUID is the run's Node's: the driver's ResourceSlices name it as
	// their owner, also once the Node is gone.
	NodeUID types.UID `json:"nodeUID,omitempty"`
}

// self is the owner of a run in this process.
func self() owner {
	o := owner{PID: os.Getpid(), BootID: bootID()}
	o.Host, _ = os.Hostname()
	if st, err := procfs.ReadStat(o.PID); err == nil {
		o.Start = st.StartTicks()
	}
	return o
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// liveness is what can be told of a run's owner here.
type liveness int

const (
	ownerGone    liveness = iota // the owner has ended: the run is over
	ownerRuns                    // the owner runs
	ownerUnknown                 // the owner is of another host
)

// alive tells whether o runs, as this host can tell.
func (o owner) alive() liveness {
	if host, _ := os.Hostname(); o.Host != host {
		return ownerUnknown
	}
	if o.BootID != "" && o.BootID != bootID() {
		return ownerGone // this host has restarted since
	}
	if o.PID <= 0 {
		return ownerGone
	}
	st, err := procfs.ReadStat(o.PID)
	switch {
	case err == nil && (st.Exited() || (o.Start != 0 && st.StartTicks() != o.Start)):
		return ownerGone
	case err == nil:
		return ownerRuns
	case errors.Is(err, fs.ErrNotExist) && o.Start != 0:
		return ownerGone
	}
	// No /proc: whether a process has the ID.
	if err := syscall.Kill(o.PID, 0); err == nil || errors.Is(err, syscall.EPERM) {
		return ownerRuns
	}
	return ownerGone
}

func (o owner) String() string {
	return fmt.Sprintf("pid %d on %s", o.PID, o.Host)
}

// writeRecord writes rec into root, atomically.
func writeRecord(root string, rec runRecord) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return fileutil.WriteAtomic(filepath.Join(root, recordFile), append(data, '\n'), 0o600)
}

// readRecord reads the run record of root.
func readRecord(root string) (runRecord, error) {
	var rec runRecord
	data, err := os.ReadFile(filepath.Join(root, recordFile))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", filepath.Join(root, recordFile), err)
	}
	if rec.Run == "" {
		return rec, fmt.Errorf("%s: no run", filepath.Join(root, recordFile))
	}
	return rec, nil
}

// ownerEnv is o as envOwner holds it: PID, start and boot ID, of this
// host.
func (o owner) env() string {
	return fmt.Sprintf("%d:%d:%s", o.PID, o.Start, o.BootID)
}

// parseOwnerEnv reads envOwner's value; the owner is of this host.
func parseOwnerEnv(v string) (owner, bool) {
	f := strings.SplitN(v, ":", 3)
	if len(f) != 3 {
		return owner{}, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return owner{}, false
	}
	host, _ := os.Hostname()
	return owner{Host: host, PID: pid, Start: start, BootID: f[2]}, true
}

// runProcess is a process with a run in its environment.
type runProcess struct {
	pid   int
	name  string
	run   string
	owner owner
	// hasOwner is false when the environment has no owner that parses.
	hasOwner bool
}

// runProcesses finds the processes whose environment names a run
// (envRun); processes it may not read are left out.
func runProcesses() []runProcess {
	var out []runProcess
	self := os.Getpid()
	for _, pid := range procfs.PIDs() {
		if pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			continue
		}
		p := runProcess{pid: pid}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			k, v, _ := strings.Cut(string(kv), "=")
			switch k {
			case envRun:
				p.run = v
			case envOwner:
				p.owner, p.hasOwner = parseOwnerEnv(v)
			}
		}
		if p.run == "" {
			continue
		}
		name, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		p.name = strings.TrimSpace(string(name))
		out = append(out, p)
	}
	return out
}
