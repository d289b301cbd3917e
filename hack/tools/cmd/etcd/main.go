// Command etcd is the etcd server, built from its Go module so the test
// control plane needs no prebuilt download. hack/build-controlplane.sh
// builds it next to kube-apiserver and kube-scheduler.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
