// Command startprocess is verify as far as its processes go: it starts
// its arguments as a command with verifyproc.Start, prints the
// command's PID and waits to be killed. TestProcessDiesWithVerify kills it
// with SIGKILL and checks that the command dies with it.
package main

import (
	"fmt"
	"os"

	"github.com/dpkit/dpkit/internal/verifyproc"
)

func main() {
	p, err := verifyproc.Start(os.Args[1:], os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(p.PID())
	<-p.Done()
	fmt.Fprintln(os.Stderr, "startprocess: the command ended:", p.Exit())
	os.Exit(1)
}
