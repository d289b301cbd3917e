// Package discovery groups dpkit's device sources. Each subpackage reads one
// part of a host below roots passed in by the caller, so every one of them
// runs unchanged against the real /sys, /dev and /proc or against a fixture
// tree:
//
//   - devfs: device nodes below the dev root (globs, presence, access) and a
//     watcher that turns fsnotify events and a periodic tick into rescans.
//   - pci: PCI functions from /sys/bus/pci/devices.
//   - usb: USB devices from /sys/bus/usb/devices and their /dev/bus/usb nodes.
//   - amd: AMD GPUs from the KFD topology in /sys/class/kfd.
//   - nvidia: NVIDIA GPUs from /proc/driver/nvidia/gpus, without cgo.
//   - numa: NUMA locality from sysfs and packing of requests onto few nodes.
//
// Host paths reported by these packages (for example "/dev/dri/renderD128")
// are paths on the host, not below the root the process reads them from: the
// kubelet and the container runtime resolve them on the host.
package discovery
