// Command dpkit-fakedra runs the fake DRA driver (internal/fakedra), built
// on the upstream kubeletplugin helper, as a process for dpkit's tests and
// demos. The helper reads ResourceClaims through a client. With
// --kubeconfig and --node-name it is an API server's: the driver publishes
// a ResourceSlice of its devices for the node and reads the claims the
// scheduler allocated, as a real driver. Otherwise it is a fake clientset
// that answers every get of a claim from the file
// <claims-dir>/<namespace>_<name>.json (a resource.k8s.io/v1
// ResourceClaim), read at the time of the call, so a test writes a claim
// there before the kubelet side asks for it.
//
// Protocol: one JSON object per line on stdout; commands one per line on
// stdin. Logs go to stderr.
//
//	{"event":"ready","registrationSocket":...}
//	{"event":"call","method":"NodePrepareResources","claims":[UID...]}
//	{"event":"call","method":"NodeUnprepareResources","claims":[UID...]}
//
//	health DEVICE Healthy|Unhealthy|Unknown [MESSAGE...]
//	fail-prepare MESSAGE...     every claim's prepare fails with MESSAGE
//	fail-unprepare MESSAGE...   every claim's unprepare fails with MESSAGE
//	heal                        no more failures
//
// Every command is answered {"event":"done","command":LINE} once it took
// effect, or {"event":"error","error":...}.
//
// It stops on SIGINT/SIGTERM. Stdin closing (a script started it with &,
// or with </dev/null) ends the commands only: the driver keeps serving.
// So does a terminal it cannot read: started with & from an interactive
// shell, its read of the terminal fails (SIGTTIN is ignored), where it
// would otherwise stop the whole driver until brought to the foreground.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/dpkit/dpkit/internal/fakedra"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dpkit-fakedra:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		driver     = flag.String("driver", fakedra.DefaultDriverName, "DRA driver name")
		registry   = flag.String("registry-dir", "", "the kubelet's plugins_registry directory (required)")
		pluginDir  = flag.String("plugin-dir", "", "directory of the driver's service socket (default <registry-dir>/../plugins/<driver>)")
		claimsDir  = flag.String("claims-dir", "", "directory of <namespace>_<name>.json ResourceClaims (required without --kubeconfig)")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the API server to read claims from and publish the node's ResourceSlice to (with --node-name)")
		nodeName   = flag.String("node-name", "", "the node the driver runs for (with --kubeconfig)")
		devices    = flag.String("devices", "dev-0,dev-1", "comma-separated device names")
		pool       = flag.String("pool", "pool", "pool name of the devices")
		rolling    = flag.String("rolling-update", "", "register as a rolling-update instance with this pod UID")
		noHealth   = flag.Bool("no-health", false, "decline health reporting (the health service answers Unimplemented)")
		v1beta1    = flag.Bool("v1beta1-only", false, "serve only the v1beta1 DRAPlugin service")
		resend     = flag.Duration("resend", 10*time.Second, "how often the health report is sent again without a change")
	)
	flag.Parse()
	var errs []error
	if *registry == "" {
		errs = append(errs, errors.New("--registry-dir is required: the kubelet's plugins_registry directory"))
	}
	switch {
	case *kubeconfig != "" && *nodeName == "":
		errs = append(errs, errors.New("--node-name is required with --kubeconfig: the node whose ResourceSlice the driver publishes"))
	case *kubeconfig == "" && *nodeName != "":
		errs = append(errs, errors.New("--kubeconfig is required with --node-name: the API server to publish the ResourceSlice to"))
	case *kubeconfig == "" && *claimsDir == "":
		errs = append(errs, errors.New("--claims-dir is required without --kubeconfig: where the ResourceClaims to prepare are read"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if *pluginDir == "" {
		*pluginDir = filepath.Join(filepath.Dir(*registry), "plugins", *driver)
	}
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		return err
	}

	var client kubernetes.Interface
	if *kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
	} else {
		client = fileClaims(*claimsDir)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A background job that reads its terminal is stopped (SIGTTIN), the
	// driver's gRPC servers with it; ignored, the read fails instead and
	// only the commands end.
	signal.Ignore(syscall.SIGTTIN)
	var opts []kubeletplugin.Option
	if *v1beta1 {
		opts = append(opts, kubeletplugin.NodeV1(false))
	}
	d, err := fakedra.Start(ctx, fakedra.Config{
		DriverName:    *driver,
		RegistryDir:   *registry,
		PluginDir:     *pluginDir,
		Pool:          *pool,
		Devices:       strings.Split(*devices, ","),
		Client:        client,
		NodeName:      *nodeName,
		RollingUpdate: types.UID(*rolling),
		NoHealth:      *noHealth,
		ResendEvery:   *resend,
		Options:       opts,
	})
	if err != nil {
		return err
	}
	defer d.Stop()
	return serve(ctx, d, *driver)
}

// fileClaims is a fake clientset answering gets of ResourceClaims from
// dir/<namespace>_<name>.json.
func fileClaims(dir string) kubernetes.Interface {
	client := fake.NewClientset()
	client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		g := a.(k8stesting.GetAction)
		blob, err := os.ReadFile(filepath.Join(dir, g.GetNamespace()+"_"+g.GetName()+".json"))
		if errors.Is(err, os.ErrNotExist) {
			return true, nil, apierrors.NewNotFound(resourcev1.Resource("resourceclaims"), g.GetName())
		}
		if err != nil {
			return true, nil, err
		}
		var c resourcev1.ResourceClaim
		if err := json.Unmarshal(blob, &c); err != nil {
			return true, nil, err
		}
		return true, &c, nil
	})
	return client
}

// serve reports the driver's calls on stdout and runs the commands of
// stdin until ctx ends; a closed stdin ends the commands only.
func serve(ctx context.Context, d *fakedra.Driver, driver string) error {
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(v any) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = enc.Encode(v)
	}
	// Report calls as they come.
	go func() {
		seen := 0
		for {
			ch := d.Changed()
			calls := d.Calls()
			for _, c := range calls[seen:] {
				emit(map[string]any{"event": "call", "method": c.Method, "claims": c.Claims})
			}
			seen = len(calls)
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	emit(map[string]any{"event": "ready", "driver": driver})

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				lines = nil // no more commands; serve until a signal
				continue
			}
			if err := command(d, line); err != nil {
				emit(map[string]any{"event": "error", "error": err.Error()})
				continue
			}
			emit(map[string]any{"event": "done", "command": line})
		}
	}
}

func command(d *fakedra.Driver, line string) error {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	rest := strings.Join(f[1:], " ")
	switch f[0] {
	case "health":
		if len(f) < 3 {
			return fmt.Errorf("usage: health DEVICE Healthy|Unhealthy|Unknown [MESSAGE]")
		}
		d.SetHealth(f[1], kubeletplugin.HealthStatus(f[2]), strings.Join(f[3:], " "))
	case "fail-prepare":
		d.FailPrepare(rest)
	case "fail-unprepare":
		d.FailUnprepare(rest)
	case "heal":
		d.FailPrepare("")
		d.FailUnprepare("")
	default:
		return fmt.Errorf("unknown command %q: use health, fail-prepare, fail-unprepare or heal", f[0])
	}
	return nil
}
