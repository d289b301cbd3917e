package controlplane_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpkit/dpkit/test/controlplane"
)

func TestMissingBinariesNameTheBuildCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := controlplane.Start(context.Background(), controlplane.Options{BinDir: dir, Scheduler: true})
	if !errors.Is(err, controlplane.ErrBinariesMissing) {
		t.Fatalf("Start with empty BinDir: err = %v, want ErrBinariesMissing", err)
	}
	for _, want := range []string{"etcd, kube-apiserver, kube-scheduler", dir, controlplane.EnvBinDir + "=" + dir, "hack/build-controlplane.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestControlPlane(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, SchedulerQPS: 200, SchedulerBurst: 400})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("version", func(t *testing.T) {
		v, err := cp.Client().Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		if v.GitVersion != controlplane.Version {
			t.Errorf("server version %q, want %q", v.GitVersion, controlplane.Version)
		}
	})

	t.Run("admin kubeconfig file", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		c := kubernetes.NewForConfigOrDie(cfg)
		if _, err := c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Fatalf("admin cannot read namespace default: %v", err)
		}
	})

	t.Run("node identity", func(t *testing.T) {
		cfg, err := cp.RESTConfigFor("system:node:cp-node-a", "system:nodes")
		if err != nil {
			t.Fatal(err)
		}
		node := kubernetes.NewForConfigOrDie(cfg)
		if _, err := node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-node-a"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("node cannot register itself: %v", err)
		}
		if _, err := cp.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-node-b"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err = node.CoreV1().Nodes().Patch(ctx, "cp-node-b", "application/merge-patch+json",
			[]byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("node A patching node B: err = %v, want Forbidden (NodeRestriction)", err)
		}
		// Pods need no ServiceAccount: the admission plugin is off.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		if _, err := cp.Client().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod without a ServiceAccount: %v", err)
		}
	})

	t.Run("scheduler client rate limit", func(t *testing.T) {
		// The scheduler reports the configuration it runs with.
		certFile, keyFile, err := cp.IssueClientCert("configz-reader", "system:masters")
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}, Timeout: 10 * time.Second} //nolint:gosec // the scheduler's self-signed serving certificate
		var got struct {
			ComponentConfig struct {
				ClientConnection struct {
					QPS   float32 `json:"qps"`
					Burst int32   `json:"burst"`
				} `json:"clientConnection"`
				LeaderElection struct {
					LeaderElect *bool `json:"leaderElect"`
				} `json:"leaderElection"`
			} `json:"componentconfig"`
		}
		// /healthz answers before the scheduler has read the client CA from
		// the apiserver; until then a client certificate is not recognized
		// and /configz says 403.
		var last string
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.SchedulerURL+"/configz", nil)
			resp, err := hc.Do(req)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				last = resp.Status
				return false, nil
			}
			return true, json.NewDecoder(resp.Body).Decode(&got)
		})
		if err != nil {
			t.Fatalf("GET %s/configz: %v (last: %s)", cp.SchedulerURL, err, last)
		}
		cc := got.ComponentConfig
		if cc.ClientConnection.QPS != 200 || cc.ClientConnection.Burst != 400 {
			t.Errorf("scheduler client qps %v burst %d, want 200 and 400", cc.ClientConnection.QPS, cc.ClientConnection.Burst)
		}
		if le := cc.LeaderElection.LeaderElect; le == nil || *le {
			t.Errorf("scheduler leaderElect %v, want false", le)
		}
	})

	t.Run("client CA and certificates", func(t *testing.T) {
		for _, f := range []string{cp.ClientCAFile, cp.ServingCAFile} {
			if _, err := os.Stat(f); err != nil {
				t.Error(err)
			}
		}
		certFile, keyFile, err := cp.IssueServingCert("node", "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{certFile, keyFile} {
			if _, err := os.Stat(f); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("stop kills by pid and removes the directory", func(t *testing.T) {
		pids := cp.PIDs()
		if len(pids) != 3 {
			t.Fatalf("PIDs = %v, want etcd, kube-apiserver and kube-scheduler", pids)
		}
		if err := cp.Stop(); err != nil {
			t.Fatal(err)
		}
		for name, pid := range pids {
			// Stop waited for each process, so its PID is reaped.
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("%s (pid %d) still exists after Stop: %v", name, pid, err)
			}
		}
		if _, err := os.Stat(cp.Dir); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Stop: %v", cp.Dir, err)
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("second Stop: %v", err)
		}
	})
}

func TestStartFailureCarriesTheLog(t *testing.T) {
	if testing.Short() {
		t.Skip(controlplane.SkipMessage)
	}
	t.Parallel()
	_, err := controlplane.Start(context.Background(), controlplane.Options{APIServerArgs: []string{"--no-such-flag"}})
	if err == nil {
		t.Fatal("Start with a bad apiserver flag succeeded")
	}
	for _, want := range []string{"kube-apiserver", "exited before it was ready", "kube-apiserver.log", "no-such-flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}
