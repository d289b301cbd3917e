package emulator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// RootEnv is the environment variable that names the root of the
// emulator "dpkit admit", "dpkit get" and "dpkit delete" talk to when
// --root is not given.
const RootEnv = "DPKIT_ROOT"

// Where a Root came from.
const (
	FromFlag     = "--root"
	FromEnv      = "$" + RootEnv
	FromRecorded = "the last dpkit up or dpkit kubelet"
	FromDefault  = "the default"
)

// Root is the root directory a client command talks to, and where that
// choice came from (FromFlag, FromEnv, FromRecorded or FromDefault).
type Root struct {
	Dir  string
	From string
}

// Explain adds to err which root was used and why, when it was not given
// with --root: a user who did not type it may not expect it. An invalid
// manifest is not the root's business and is left as it is.
func (r Root) Explain(err error) error {
	if err == nil || r.From == FromFlag {
		return err
	}
	var invalid *InvalidPodError
	var ae *APIError
	if errors.As(err, &invalid) || errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest {
		return err
	}
	return fmt.Errorf("%w\n(root %s, from %s; --root chooses another)", err, r.Dir, r.From)
}

// ChooseRoot returns the root a client command talks to: flag when the
// flag was given (set), else $DPKIT_ROOT, else the root the last
// "dpkit up" or "dpkit kubelet" recorded (RecordRoot) while an emulator
// still serves its admin API there, else DefaultRoot. getenv reads the
// environment (os.Getenv).
func ChooseRoot(flag string, set bool, getenv func(string) string) Root {
	if set {
		return Root{Dir: flag, From: FromFlag}
	}
	if dir := getenv(RootEnv); dir != "" {
		return Root{Dir: dir, From: FromEnv}
	}
	if file := StateFile(getenv); file != "" {
		if data, err := os.ReadFile(file); err == nil {
			if dir := strings.TrimSpace(string(data)); dir != "" && serving(AdminSocket(dir)) {
				return Root{Dir: dir, From: FromRecorded}
			}
		}
	}
	return Root{Dir: DefaultRoot, From: FromDefault}
}

// RecordRoot records root, made absolute, as the root of the emulator
// that started last, for ChooseRoot. It does nothing when StateFile has
// nowhere to write.
func RecordRoot(root string, getenv func(string) string) error {
	file := StateFile(getenv)
	if file == "" {
		return nil
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("recording the root: %w", err)
	}
	if err := fileutil.WriteAtomic(file, []byte(abs+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the root: %w", err)
	}
	return nil
}

// StateFile returns where RecordRoot records the root:
// $XDG_STATE_HOME/dpkit/last-root, else ~/.local/state/dpkit/last-root
// (the XDG base directory default); "" when neither variable is set.
func StateFile(getenv func(string) string) string {
	if dir := getenv("XDG_STATE_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "dpkit", "last-root")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "state", "dpkit", "last-root")
	}
	return ""
}

// serving reports whether something accepts connections on the unix
// socket at path.
func serving(path string) bool {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
