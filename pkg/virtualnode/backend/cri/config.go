package cri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// sandboxConfig is the pod's sandbox as the kubelet would ask for it
// (generatePodSandboxConfig), less sysctls and the pod's resource limits
// (its cgroup parent is pod<UID> below Config.CgroupRoot, if any). The DNS configuration is added when the sandbox is
// created (createSandbox).
func (pr *podRun) sandboxConfig() *runtimeapi.PodSandboxConfig {
	pod := pr.pod
	sc := &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: namespaces(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		sc.RunAsUser = int64Value(psc.RunAsUser)
		sc.RunAsGroup = int64Value(psc.RunAsGroup)
		sc.SupplementalGroups = psc.SupplementalGroups
		sc.SelinuxOptions = selinux(psc.SELinuxOptions)
	}
	sc.Seccomp = pr.b.seccomp(podSeccomp(pod), nil)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		LogDirectory: pr.logDir(),
		Labels:       map[string]string{LabelNode: pr.b.cfg.Node, LabelPodUID: string(pod.UID)},
		Annotations:  map[string]string{AnnotationPod: podAnnotation(pod)},
		PortMappings: portMappings(pod),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: sc, CgroupParent: pr.b.podCgroup(pod.UID)},
	}
	// As the kubelet: a pod on the host network has the node's hostname.
	if !pod.Spec.HostNetwork {
		cfg.Hostname = pr.b.dns().KernelHostname(pod)
	}
	return cfg
}

// createSandbox asks the runtime for the pod's sandbox with the pod's DNS
// configuration, computed then as the kubelet does for each sandbox.
func (pr *podRun) createSandbox(ctx context.Context) (string, error) {
	// As the kubelet's GetNodenameForKernel: the kernel keeps 64
	// characters of a hostname.
	if h := pr.sandbox.Hostname; len(h) > 64 {
		return "", fmt.Errorf("failed to construct FQDN from pod hostname and cluster domain, FQDN %s is too long (64 characters is the max, %d characters requested)", h, len(h))
	}
	dns, err := pr.dnsConfig()
	if err != nil {
		return "", err
	}
	pr.sandbox.DnsConfig = dns
	if err := unsupportedPodFields(pr.pod); err != nil {
		return "", err
	}
	return pr.b.rt.RunPodSandbox(pr.b.logctx(ctx), pr.sandbox, "")
}

// namespaces are the pod's Linux namespaces: its own network, PID and IPC
// namespaces unless it asks for the host's (the PID namespace is per
// container unless shareProcessNamespace).
func namespaces(pod *corev1.Pod) *runtimeapi.NamespaceOption {
	ns := &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD}
	if pod.Spec.HostNetwork {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		ns.Pid = runtimeapi.NamespaceMode_POD
	}
	if pod.Spec.HostPID {
		ns.Pid = runtimeapi.NamespaceMode_NODE
	}
	if pod.Spec.HostIPC {
		ns.Ipc = runtimeapi.NamespaceMode_NODE
	}
	return ns
}

func int64Value(v *int64) *runtimeapi.Int64Value {
	if v == nil {
		return nil
	}
	return &runtimeapi.Int64Value{Value: *v}
}

// containerConfig is one run of c: its command with $(VAR) expanded, the
// environment (literal values, then what the node resolved and the
// device plugins' variables), the devices, mounts, annotations and CDI
// devices of its device plugins and claims, its limits and security
// context.
func (pr *podRun) containerConfig(ctx context.Context, c *corev1.Container, attempt uint32, imageRef string) (*runtimeapi.ContainerConfig, error) {
	pod, spec := pr.pod, *c
	var env podruntime.Env
	if err := env.AddContainerEnv(ctx, pod, &spec, pr.b.cfg.ContainerEnv, func(name string) bool { return name == cdiEnv }); err != nil {
		return nil, err
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata:   &runtimeapi.ContainerMetadata{Name: spec.Name, Attempt: attempt},
		Image:      &runtimeapi.ImageSpec{Image: imageRef, UserSpecifiedImage: spec.Image},
		WorkingDir: spec.WorkingDir,
		Labels:     map[string]string{LabelNode: pr.b.cfg.Node, LabelPodUID: string(pod.UID), LabelContainer: spec.Name},
		LogPath:    filepath.Join(spec.Name, strconv.Itoa(int(attempt))+".log"),
		Stdin:      spec.Stdin, StdinOnce: spec.StdinOnce, Tty: spec.TTY,
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources:       resources(spec),
			SecurityContext: pr.b.securityContext(pod, spec),
		},
	}
	if sc := cfg.Linux.SecurityContext; sc.RunAsUser == nil {
		// As the kubelet: without a user in the pod, the image's user,
		// by UID or name, else root, named explicitly (the runtime then
		// sets HOME from the image's /etc/passwd).
		uid, name, err := pr.imageUser(ctx, imageRef)
		if err != nil {
			return nil, err
		}
		sc.RunAsUser, sc.RunAsUsername = uid, name
	}
	if err := verifyRunAsNonRoot(pod, spec, cfg.Linux.SecurityContext); err != nil {
		return nil, err
	}
	cfg.Command, cfg.Args = env.Expand(spec.Command), env.Expand(spec.Args)
	for _, k := range env.Names() {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(env.Get(k))})
	}
	if pr.b.cfg.ContainerDevices != nil {
		d, err := pr.b.cfg.ContainerDevices(ctx, pod, spec.Name)
		if err != nil {
			return nil, err
		}
		if d != nil {
			for _, dev := range d.Devices {
				cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: dev.ContainerPath, HostPath: dev.HostPath, Permissions: dev.Permissions})
			}
			for _, m := range d.Mounts {
				cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
			}
			cfg.Annotations = d.Annotations
			for _, name := range d.CDIDevices {
				cfg.CDIDevices = append(cfg.CDIDevices, &runtimeapi.CDIDevice{Name: name})
			}
		}
	}
	// Then, as the kubelet's makeMounts, the volumes, the managed
	// /etc/hosts and the termination message file.
	mounts, err := pr.mounts(&spec, env.Vars())
	if err != nil {
		return nil, err
	}
	cfg.Mounts = append(cfg.Mounts, mounts...)
	if m, err := pr.etcHostsMount(&spec); err != nil {
		return nil, err
	} else if m != nil {
		cfg.Mounts = append(cfg.Mounts, m)
	}
	if m, err := pr.terminationMessageMount(&spec); err != nil {
		return nil, err
	} else if m != nil {
		cfg.Mounts = append(cfg.Mounts, m)
	}
	return cfg, nil
}

// resources are the container's CPU and memory limits and CPU shares, as
// the kubelet computes them for cgroups.
func resources(c corev1.Container) *runtimeapi.LinuxContainerResources {
	r := &runtimeapi.LinuxContainerResources{CpuShares: 2}
	if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
		r.CpuShares = max(2, q.MilliValue()*1024/1000)
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		r.CpuPeriod = 100000
		r.CpuQuota = max(1000, q.MilliValue()*100000/1000)
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		r.MemoryLimitInBytes = q.Value()
	}
	return r
}

// securityContext is the container's security context, the pod's values
// as defaults: users, groups, SELinux, seccomp and AppArmor as the kubelet
// passes them to the runtime.
func (b *Backend) securityContext(pod *corev1.Pod, c corev1.Container) *runtimeapi.LinuxContainerSecurityContext {
	sc := &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaces(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		sc.RunAsUser = int64Value(psc.RunAsUser)
		sc.RunAsGroup = int64Value(psc.RunAsGroup)
		sc.SupplementalGroups = psc.SupplementalGroups
		sc.SelinuxOptions = selinux(psc.SELinuxOptions)
	}
	csc := c.SecurityContext
	var ctrSeccomp *corev1.SeccompProfile
	var ctrAppArmor *corev1.AppArmorProfile
	if csc != nil {
		ctrSeccomp, ctrAppArmor = csc.SeccompProfile, csc.AppArmorProfile
		if o := selinux(csc.SELinuxOptions); o != nil {
			sc.SelinuxOptions = o
		}
	}
	sc.Seccomp = b.seccomp(podSeccomp(pod), ctrSeccomp)
	sc.Apparmor = apparmor(pod, ctrAppArmor)
	var procMount *corev1.ProcMountType
	if csc != nil {
		procMount = csc.ProcMount
	}
	sc.MaskedPaths, sc.ReadonlyPaths = maskedPaths(procMount), readonlyPaths(procMount)
	if csc == nil {
		return sc
	}
	if csc.RunAsUser != nil {
		sc.RunAsUser = int64Value(csc.RunAsUser)
	}
	if csc.RunAsGroup != nil {
		sc.RunAsGroup = int64Value(csc.RunAsGroup)
	}
	if csc.Privileged != nil {
		sc.Privileged = *csc.Privileged
	}
	if csc.ReadOnlyRootFilesystem != nil {
		sc.ReadonlyRootfs = *csc.ReadOnlyRootFilesystem
	}
	if csc.AllowPrivilegeEscalation != nil {
		sc.NoNewPrivs = !*csc.AllowPrivilegeEscalation
	}
	if caps := csc.Capabilities; caps != nil {
		sc.Capabilities = &runtimeapi.Capability{}
		for _, a := range caps.Add {
			sc.Capabilities.AddCapabilities = append(sc.Capabilities.AddCapabilities, string(a))
		}
		for _, d := range caps.Drop {
			sc.Capabilities.DropCapabilities = append(sc.Capabilities.DropCapabilities, string(d))
		}
	}
	return sc
}

// imageUser is the user the kubelet runs a container as when the pod
// names none (kuberuntime getImageUser): the image's UID, else its user
// name, else root.
func (pr *podRun) imageUser(ctx context.Context, image string) (*runtimeapi.Int64Value, string, error) {
	st, err := pr.b.img.ImageStatus(pr.b.logctx(ctx), &runtimeapi.ImageSpec{Image: image}, false)
	if err != nil {
		return nil, "", fmt.Errorf("inspect image %q for its user: %w", image, err)
	}
	if img := st.GetImage(); img != nil {
		if img.Uid != nil {
			return &runtimeapi.Int64Value{Value: img.Uid.Value}, "", nil
		}
		if img.Username != "" {
			return nil, img.Username, nil
		}
	}
	return &runtimeapi.Int64Value{}, "", nil
}

// defaultReadonlyPaths and the fixed part of maskedPaths are the
// kubelet's (pkg/securitycontext, kept in sync with moby): without them
// the runtime masks nothing of /proc and /sys.
var defaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

var defaultMaskedPaths = sync.OnceValue(func() []string {
	paths := []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	for _, cpu := range possibleCPUs() {
		p := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/thermal_throttle", cpu)
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	return paths
})

// maskedPaths and readonlyPaths are the kubelet's for a proc mount type:
// none for Unmasked, the defaults otherwise.
func maskedPaths(pm *corev1.ProcMountType) []string {
	if pm != nil && *pm == corev1.UnmaskedProcMount {
		return []string{}
	}
	return defaultMaskedPaths()
}

func readonlyPaths(pm *corev1.ProcMountType) []string {
	if pm != nil && *pm == corev1.UnmaskedProcMount {
		return []string{}
	}
	return slices.Clone(defaultReadonlyPaths)
}

// possibleCPUs lists the CPUs of /sys/devices/system/cpu/possible
// ("0-3,8"); nothing when it cannot be read.
func possibleCPUs() []int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return nil
	}
	var cpus []int
	for part := range strings.SplitSeq(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil {
				return nil
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// DefaultSeccompDir is where Localhost seccomp profiles are read, below
// the kubelet's root (the kubelet's <root-dir>/seccomp).
const DefaultSeccompDir = "seccomp"

func podSeccomp(pod *corev1.Pod) *corev1.SeccompProfile {
	if psc := pod.Spec.SecurityContext; psc != nil {
		return psc.SeccompProfile
	}
	return nil
}

// seccomp is the runtime's seccomp profile for a container (or, with ctr
// nil, the sandbox), as the kubelet's getSeccompProfile: the container's
// profile, else the pod's, else Unconfined (the kubelet's default with
// seccompDefault off); a Localhost profile is a file below the seccomp
// directory.
func (b *Backend) seccomp(pod, ctr *corev1.SeccompProfile) *runtimeapi.SecurityProfile {
	p := pod
	if ctr != nil {
		p = ctr
	}
	if p == nil {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
	}
	switch p.Type {
	case corev1.SeccompProfileTypeRuntimeDefault:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	case corev1.SeccompProfileTypeLocalhost:
		ref := ""
		if p.LocalhostProfile != nil {
			ref = filepath.Join(b.seccompDir(), filepath.Clean("/"+*p.LocalhostProfile))
		}
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: ref}
	default:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
	}
}

func (b *Backend) seccompDir() string {
	if b.cfg.SeccompDir != "" {
		return b.cfg.SeccompDir
	}
	return filepath.Join(filepath.Dir(b.cfg.PodDir), DefaultSeccompDir)
}

// apparmor is the runtime's AppArmor profile for a container: the
// container's, else the pod's; none leaves the runtime's default (as the
// kubelet does where no profile is asked for).
func apparmor(pod *corev1.Pod, ctr *corev1.AppArmorProfile) *runtimeapi.SecurityProfile {
	p := ctr
	if p == nil && pod.Spec.SecurityContext != nil {
		p = pod.Spec.SecurityContext.AppArmorProfile
	}
	if p == nil {
		return nil
	}
	switch p.Type {
	case corev1.AppArmorProfileTypeRuntimeDefault:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	case corev1.AppArmorProfileTypeLocalhost:
		ref := ""
		if p.LocalhostProfile != nil {
			ref = *p.LocalhostProfile
		}
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: ref}
	default:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
	}
}

func selinux(o *corev1.SELinuxOptions) *runtimeapi.SELinuxOption {
	if o == nil {
		return nil
	}
	return &runtimeapi.SELinuxOption{User: o.User, Role: o.Role, Type: o.Type, Level: o.Level}
}

// unsupportedPodFields refuses what this backend cannot give a pod, so
// that it never runs without it: another runtime handler (the kubelet
// resolves spec.runtimeClassName through the RuntimeClass API) and user
// namespaces (spec.hostUsers: false). The pod stays Pending with the
// reason, as a kubelet's pod whose sandbox cannot be created.
func unsupportedPodFields(pod *corev1.Pod) error {
	if n := pod.Spec.RuntimeClassName; n != nil && *n != "" {
		return fmt.Errorf("spec.runtimeClassName %q: this node runs every pod with the runtime's default handler and cannot run it with another; remove spec.runtimeClassName, or schedule the pod to a node whose kubelet has that RuntimeClass", *n)
	}
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		return errors.New("spec.hostUsers: false asks for a user namespace, which this node does not set up; remove spec.hostUsers, or schedule the pod to a node with user namespace support")
	}
	return nil
}

// verifyRunAsNonRoot is the kubelet's check of runAsNonRoot against the
// user the container will run as (kuberuntime verifyRunAsNonRoot), with
// its messages.
func verifyRunAsNonRoot(pod *corev1.Pod, c corev1.Container, sc *runtimeapi.LinuxContainerSecurityContext) error {
	nonRoot := false
	if psc := pod.Spec.SecurityContext; psc != nil && psc.RunAsNonRoot != nil {
		nonRoot = *psc.RunAsNonRoot
	}
	explicit := pod.Spec.SecurityContext != nil && pod.Spec.SecurityContext.RunAsUser != nil
	if csc := c.SecurityContext; csc != nil {
		if csc.RunAsNonRoot != nil {
			nonRoot = *csc.RunAsNonRoot
		}
		explicit = explicit || csc.RunAsUser != nil
	}
	if !nonRoot {
		return nil
	}
	who := fmt.Sprintf("(pod: %q, container: %s)", pod.Name+"_"+pod.Namespace+"("+string(pod.UID)+")", c.Name)
	switch {
	case explicit && sc.RunAsUser != nil && sc.RunAsUser.Value == 0:
		return fmt.Errorf("container's runAsUser breaks non-root policy %s", who)
	case sc.RunAsUser != nil && sc.RunAsUser.Value == 0:
		return fmt.Errorf("container has runAsNonRoot and image will run as root %s", who)
	case sc.RunAsUser == nil && sc.RunAsUsername != "":
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root %s", sc.RunAsUsername, who)
	}
	return nil
}
