package cri

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// dns is the node's DNS settings.
func (b *Backend) dns() podruntime.DNS {
	return podruntime.DNS{ClusterDNS: b.cfg.ClusterDNS, ClusterDomain: b.cfg.ClusterDomain, ResolvConf: b.cfg.ResolvConf}
}

// dnsConfig is the pod's resolver configuration, as the kubelet's
// GetPodDNS (podruntime.DNS.ForPod).
func (pr *podRun) dnsConfig() (*runtimeapi.DNSConfig, error) {
	d, err := pr.b.dns().ForPod(pr.pod, pr.podEvent)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.DNSConfig{Servers: d.Servers, Searches: d.Searches, Options: d.Options}, nil
}

// etcHostsPath is the pod's managed /etc/hosts, as the kubelet's
// <pod dir>/etc-hosts.
func (pr *podRun) etcHostsPath() string { return filepath.Join(pr.podDir(), "etc-hosts") }

// ensureEtcHosts writes the pod's /etc/hosts once, as the kubelet's
// ensureHostsFile: the pod's own entries, or with hostNetwork the node's
// /etc/hosts, then the pod's hostAliases.
func (pr *podRun) ensureEtcHosts(ip string) (string, error) {
	path := pr.etcHostsPath()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	var b bytes.Buffer
	if pr.pod.Spec.HostNetwork {
		node, err := os.ReadFile(pr.b.cfg.HostsFile)
		if err != nil {
			return "", err
		}
		b.WriteString("# Kubernetes-managed hosts file (host network).\n")
		b.Write(node)
	} else {
		hostname, domain := pr.b.dns().HostnameAndDomain(pr.pod)
		b.WriteString("# Kubernetes-managed hosts file.\n")
		b.WriteString("127.0.0.1\tlocalhost\n")
		b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
		b.WriteString("fe00::0\tip6-localnet\n")
		b.WriteString("fe00::0\tip6-mcastprefix\n")
		b.WriteString("fe00::1\tip6-allnodes\n")
		b.WriteString("fe00::2\tip6-allrouters\n")
		if domain != "" {
			fmt.Fprintf(&b, "%s\t%s.%s\t%s\n", ip, hostname, domain, hostname)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
	}
	if aliases := pr.pod.Spec.HostAliases; len(aliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range aliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	if err := os.MkdirAll(pr.podDir(), 0o750); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, b.Bytes(), 0o644) //nolint:gosec // world-readable, as the kubelet's
}

// portMappings are the ports of the pod's app containers, as the
// kubelet's generatePodSandboxConfig passes them (MakePortMappings): every
// port, with or without a hostPort (the runtime's CNI portmap maps those
// with one), a name given twice in a container kept once.
func portMappings(pod *corev1.Pod) []*runtimeapi.PortMapping {
	var out []*runtimeapi.PortMapping
	for _, c := range pod.Spec.Containers {
		names := map[string]bool{}
		for _, p := range c.Ports {
			name := p.Name
			if name == "" {
				family := "any"
				if p.HostIP != "" {
					family = "v4"
					if strings.Contains(p.HostIP, ":") {
						family = "v6"
					}
				}
				name = fmt.Sprintf("%s-%s-%s:%d:%d", family, p.Protocol, p.HostIP, p.ContainerPort, p.HostPort)
			}
			if names[name] {
				continue
			}
			names[name] = true
			proto := runtimeapi.Protocol_TCP
			switch p.Protocol {
			case corev1.ProtocolUDP:
				proto = runtimeapi.Protocol_UDP
			case corev1.ProtocolSCTP:
				proto = runtimeapi.Protocol_SCTP
			}
			out = append(out, &runtimeapi.PortMapping{Protocol: proto, ContainerPort: p.ContainerPort, HostPort: p.HostPort, HostIp: p.HostIP})
		}
	}
	return out
}
