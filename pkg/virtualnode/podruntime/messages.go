package podruntime

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Event reasons, the kubelet's (pkg/kubelet/events/event.go).
const (
	EventKilling                = "Killing"                // events.KillingContainer
	EventUnhealthy              = "Unhealthy"              // events.ContainerUnhealthy
	EventProbeWarning           = "ProbeWarning"           // events.ContainerProbeWarning
	EventFailedPostStartHook    = "FailedPostStartHook"    // events.FailedPostStartHook
	EventFailedPreStopHook      = "FailedPreStopHook"      // events.FailedPreStopHook
	EventFailedMount            = "FailedMount"            // events.FailedMountVolume
	EventFailedCreatePodSandBox = "FailedCreatePodSandBox" // events.FailedCreatePodSandBox
	EventMissingClusterDNS      = "MissingClusterDNS"      // pkg/kubelet/network/dns
	EventDNSConfigForming       = "DNSConfigForming"       // pkg/kubelet/network/dns
	EventLifecycleHTTPFallback  = "LifecycleHTTPFallback"  // pkg/kubelet/lifecycle
)

// Reasons of a container's Waiting and Terminated states, the kubelet's
// (pkg/kubelet/container, pkg/kubelet/images, pkg/kubelet/kuberuntime).
const (
	ReasonContainerCreating          = "ContainerCreating"
	ReasonPodInitializing            = "PodInitializing"
	ReasonCrashLoopBackOff           = "CrashLoopBackOff"
	ReasonImagePullBackOff           = "ImagePullBackOff"
	ReasonErrImagePull               = "ErrImagePull"
	ReasonErrImageNeverPull          = "ErrImageNeverPull"
	ReasonErrImageInspect            = "ErrImageInspect"
	ReasonCreateContainerConfigError = "CreateContainerConfigError"
	ReasonCreateContainerError       = "CreateContainerError"
	ReasonRunContainerError          = "RunContainerError"
	ReasonStartError                 = "StartError"
	ReasonCompleted                  = "Completed"
	ReasonError                      = "Error"
	ReasonContainerStatusUnknown     = "ContainerStatusUnknown"
)

// Messages that go with the reasons above, worded as the kubelet's.
const (
	// MessageContainerStatusUnknown is the message of a container that
	// was gone when its pod was terminated.
	MessageContainerStatusUnknown = "The container could not be located when the pod was terminated"
	// MessagePostStartHookFailed and MessagePreStopHookFailed are the
	// messages of the hook failure events; as the kubelet's, they do not
	// carry the hook's output, which may hold secrets.
	MessagePostStartHookFailed = "PostStartHook failed"
	MessagePreStopHookFailed   = "PreStopHook failed"
)

// MountFailedError is the error, and FailedMount message, of a volume
// that could not be set up.
func MountFailedError(volume string, err error) error {
	return fmt.Errorf("MountVolume.SetUp failed for volume %q : %w", volume, err)
}

// PodName is a pod as the kubelet's messages name it (format.Pod):
// name_namespace(uid).
func PodName(pod *corev1.Pod) string {
	return pod.Name + "_" + pod.Namespace + "(" + string(pod.UID) + ")"
}

// CrashLoopBackOffMessage is the message of a container waiting,
// CrashLoopBackOff, to be restarted after backoff.
func CrashLoopBackOffMessage(backoff time.Duration, pod *corev1.Pod, container string) string {
	return fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", backoff, container, PodName(pod))
}

// ImagePullBackOffMessage is the message of a container waiting,
// ImagePullBackOff, to pull its image again after err.
func ImagePullBackOffMessage(image, err string) string {
	return fmt.Sprintf("Back-off pulling image %q: %s", image, err)
}

// ImageInspectMessage is the message of ErrImageInspect.
func ImageInspectMessage(image, err string) string {
	return fmt.Sprintf("Failed to inspect image %q: %s", image, err)
}

// ImageNeverPullMessage is the message of ErrImageNeverPull.
func ImageNeverPullMessage(image string) string {
	return fmt.Sprintf("Container image %q is not present with pull policy of Never", image)
}

// CreatePodSandboxMessage is the message of FailedCreatePodSandBox, and
// of the containers' Waiting state meanwhile.
func CreatePodSandboxMessage(err string) string { return "Failed to create pod sandbox: " + err }

// ProbeFailedMessage is the Unhealthy message of a probe of kind
// (Liveness, Readiness, Startup) that failed with output.
func ProbeFailedMessage(kind, output string) string {
	return fmt.Sprintf("%s probe failed: %s", kind, output)
}

// ProbeErroredMessage is the Unhealthy message of a probe that could not
// be run; result is what the probe was taken to say.
func ProbeErroredMessage(kind, result string, err error) string {
	return fmt.Sprintf("%s probe errored and resulted in %s state: %s", kind, result, err)
}

// ProbeWarningMessage is the ProbeWarning message of a probe that
// passed with a warning.
func ProbeWarningMessage(kind, output string) string {
	return fmt.Sprintf("%s probe warning: %s", kind, output)
}

// StoppingMessage is the Killing message of a container stopped with
// its pod.
func StoppingMessage(container string) string { return "Stopping container " + container }

// ProbeKillMessage is the Killing message of a container whose liveness
// or startup probe (kind) failed; restart tells whether it will be
// restarted.
func ProbeKillMessage(container, kind string, restart bool) string {
	msg := fmt.Sprintf("Container %s failed %s probe", container, strings.ToLower(kind))
	if restart {
		msg += ", will be restarted"
	}
	return msg
}

// MissingClusterDNSMessage is the MissingClusterDNS message of a
// ClusterFirst pod on a node that knows no cluster DNS server.
func MissingClusterDNSMessage(pod *corev1.Pod) string {
	msg := fmt.Sprintf("kubelet does not have ClusterDNS IP configured and cannot create Pod using %q policy. Falling back to %q policy.", corev1.DNSClusterFirst, corev1.DNSDefault)
	return fmt.Sprintf("pod: %q. %s", PodName(pod), msg)
}

// NameserversOmittedMessage and SearchesOmittedMessage are the
// DNSConfigForming messages of a DNS configuration cut down to the
// resolver's limits; applied is what was kept.
func NameserversOmittedMessage(applied []string) string {
	return "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: " + strings.Join(applied, " ")
}

// SearchesOmittedMessage: see NameserversOmittedMessage.
func SearchesOmittedMessage(applied []string) string {
	return "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: " + strings.Join(applied, " ")
}
