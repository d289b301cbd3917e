// Command leftovers runs a command (the test suite) and fails when it
// leaves anything running on the machine: processes, mounts, cgroups.
//
//	go run ./hack/leftovers [-grace 10s] -- make test
//
// It makes itself the child subreaper (PR_SET_CHILD_SUBREAPER), so every
// process the command started that outlives its parent (a shim whose
// containerd ended, a pod process whose node stopped) is reparented to it
// instead of to init, and is found however it was started. Beside those it
// compares the machine before and after: mounts that appeared, and the
// cgroups that the suite's nodes and runtimes make (top-level "dpkit-*"
// and "kubepods*", and everything below "k8s.io", where a containerd with
// no cgroup parent puts its containers), with any process still in them.
//
// What it finds is listed by name (PID, command line, working directory,
// cgroup; mount point and source; cgroup path), then ended: processes
// SIGTERM then SIGKILL after -grace, mounts detached, cgroups removed. The
// exit status is the command's when it failed, else 1 when anything was
// left, else 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return runIn(machineScope(), args, stdout, stderr)
}

// runIn is run with what counts as the command's given by scope.
func runIn(scope scope, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("leftovers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grace := fs.Duration("grace", 10*time.Second, "how long a leftover process has to end after SIGTERM before SIGKILL")
	clean := fs.Bool("clean", false, "also end what was found that does not descend from the command: processes in the suite's cgroups, mounts, cgroups (for a machine the run owns, as CI's; without it they are reported only, since another run on the machine may own them)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: leftovers [-grace DURATION] [-clean] -- COMMAND [ARG...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if err := becomeSubreaper(); err != nil {
		fmt.Fprintf(stderr, "leftovers: %v\n", err)
		return 2
	}
	before := scope.snapshot()

	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// When stdout is not a file, a leftover process holding the pipe
	// would keep Wait from returning: it is found below all the same.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "leftovers: %v\n", err)
		return 2
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var code int
wait:
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGCHLD {
				reapOrphans(cmd.Process.Pid)
				continue
			}
			_ = cmd.Process.Signal(s)
		case err := <-waited:
			code = exitStatus(err)
			break wait
		}
	}
	signal.Stop(sigs)

	found := scope.find(before)
	if found.empty() {
		fmt.Fprintln(stdout, "leftovers: the command left no process, mount or cgroup behind")
		return code
	}
	fmt.Fprintf(stderr, "leftovers: the command left these behind (a test did not stop what it started):\n%s", found)
	ctx, cancel := context.WithTimeout(context.Background(), *grace+time.Minute)
	defer cancel()
	if err := scope.end(ctx, found, *grace, *clean); err != nil {
		fmt.Fprintf(stderr, "leftovers: could not end everything: %v\n", err)
	} else {
		if *clean {
			fmt.Fprintln(stderr, "leftovers: ended them")
		} else {
			fmt.Fprintln(stderr, "leftovers: ended the processes that descend from the command; run with -clean to end the rest too")
		}
	}
	if code == 0 {
		code = 1
	}
	return code
}

// exitStatus is the command's exit code, 128+N for a signal N.
func exitStatus(err error) int {
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 2
}
