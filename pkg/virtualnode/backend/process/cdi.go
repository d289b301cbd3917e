package process

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// cdiEnv returns the environment variables the CDI specs in
// Config.CDISpecDirs give a container's CDI devices (its claims' and its
// device plugins'), as a container runtime applies them: each spec's
// common edits, then the device's own. Device nodes, mounts and hooks are
// not for processes; the process backend leaves them out. A CDI device
// that no spec names gives no environment: a process needs none of what
// a runtime would refuse to start without (its device nodes), and the
// container still learns its CDI devices from DPKIT_CDI_DEVICES.
func (pr *podRun) cdiEnv(ctx context.Context, pod *corev1.Pod, container string) ([]string, error) {
	if len(pr.b.cfg.CDISpecDirs) == 0 || pr.b.cfg.ContainerDevices == nil {
		return nil, nil
	}
	cd, err := pr.b.cfg.ContainerDevices(ctx, pod, container)
	if err != nil || cd == nil || len(cd.CDIDevices) == 0 {
		return nil, err
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(pr.b.cfg.CDISpecDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("read the CDI specs in %s: %w", strings.Join(pr.b.cfg.CDISpecDirs, ", "), err)
	}
	var env []string
	for _, id := range cd.CDIDevices {
		dev := cache.GetDevice(id)
		if dev == nil {
			pr.b.log.Debug("No CDI spec names the device; it gives no environment", "pod", pod.Namespace+"/"+pod.Name, "container", container,
				"device", id, "specDirs", strings.Join(pr.b.cfg.CDISpecDirs, ", "))
			continue
		}
		env = append(env, dev.GetSpec().ContainerEdits.Env...)
		env = append(env, dev.ContainerEdits.Env...)
	}
	return env, nil
}
