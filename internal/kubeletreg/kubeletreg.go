// Package kubeletreg holds the kubelet's (v1.37) answers to a device
// plugin's registration, written once for every kubelet-side
// implementation in dpkit: the device manager, the dptest fake kubelet and
// verify's emulator. Plugins and their tests may match on these texts, so
// they follow pkg/kubelet/cm/devicemanager word for word.
package kubeletreg

import (
	"fmt"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// CheckRequest applies the kubelet's registration server checks to a
// RegisterRequest's version and resource name, with its error texts.
func CheckRequest(version, resource string) error {
	if !slices.Contains(pluginapi.SupportedVersions[:], version) {
		return fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q", version, pluginapi.SupportedVersions)
	}
	if !resourcename.Valid(resource) {
		return InvalidResourceName(resource)
	}
	return nil
}

// InvalidResourceName is the kubelet's error for a resource name that is
// not an extended resource name.
func InvalidResourceName(resource string) error {
	return fmt.Errorf("the ResourceName %q is invalid", resource)
}

// AlreadyConnected is the kubelet's error for a registration of an
// endpoint (socket path) it is still connected to: the v1.37 kubelet keys
// plugin connections by resource and socket path and refuses a second one
// until the first one's ListAndWatch stream has ended.
func AlreadyConnected(socket string) error {
	return fmt.Errorf("device plugin already connected: %s", socket)
}
