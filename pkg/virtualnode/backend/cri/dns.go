package cri

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// The kubelet's DNS limits (pkg/apis/core/validation, ExpandedDNSConfig).
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
	maxDNSSearchLength    = 253 // DNS1123SubdomainMaxLength
	maxResolvConfLength   = 10 * 1 << 20
)

// DefaultResolvConf is the kubelet's default --resolv-conf.
const DefaultResolvConf = "/etc/resolv.conf"

// dnsConfig is the kubelet's GetPodDNS (pkg/kubelet/network/dns): the
// host's resolv.conf for Default (and for ClusterFirst on the host
// network), the cluster DNS servers and search path for ClusterFirst and
// ClusterFirstWithHostNet, nothing for None; then the pod's dnsConfig
// appended; then the resolver's limits. A ClusterFirst pod on a node
// without cluster DNS servers falls back to Default, with the kubelet's
// warning event.
func (pr *podRun) dnsConfig() (*runtimeapi.DNSConfig, error) {
	pod, cfg := pr.pod, pr.b.cfg
	servers, searches, options, err := readResolvConf(cfg.ResolvConf)
	if err != nil {
		return nil, err
	}
	dc := &runtimeapi.DNSConfig{Servers: servers, Searches: searches, Options: options}
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	cluster := policy == corev1.DNSClusterFirstWithHostNet || (policy == corev1.DNSClusterFirst && !pod.Spec.HostNetwork)
	switch {
	case policy == corev1.DNSNone:
		dc = &runtimeapi.DNSConfig{}
	case cluster && len(cfg.ClusterDNS) > 0:
		dc.Servers = slices.Clone(cfg.ClusterDNS)
		if d := cfg.ClusterDomain; d != "" {
			dc.Searches = omitDuplicates(append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, dc.Searches...))
		}
		dc.Options = []string{"ndots:5"}
	case cluster:
		pr.podEvent(corev1.EventTypeWarning, podruntime.EventMissingClusterDNS, podruntime.MissingClusterDNSMessage(pod))
	}
	if pc := pod.Spec.DNSConfig; pc != nil {
		dc.Servers = omitDuplicates(append(dc.Servers, pc.Nameservers...))
		dc.Searches = omitDuplicates(append(dc.Searches, pc.Searches...))
		dc.Options = mergeDNSOptions(dc.Options, pc.Options)
	}
	if len(dc.Servers) > maxDNSNameservers {
		dc.Servers = dc.Servers[:maxDNSNameservers]
		pr.podEvent(corev1.EventTypeWarning, podruntime.EventDNSConfigForming, podruntime.NameserversOmittedMessage(dc.Servers))
	}
	if s, cut := searchFitsLimits(dc.Searches); cut {
		dc.Searches = s
		pr.podEvent(corev1.EventTypeWarning, podruntime.EventDNSConfigForming, podruntime.SearchesOmittedMessage(s))
	}
	return dc, nil
}

// readResolvConf is the kubelet's parseResolvConf: nameserver lines
// accumulate, the last search and options lines win, search domains lose
// a trailing dot.
func readResolvConf(path string) (servers, searches, options []string, err error) {
	f, err := os.Open(path) //nolint:gosec // the node's resolver configuration, named by its operator
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the node's resolver configuration: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxResolvConfLength))
	if err != nil {
		return nil, nil, nil, err
	}
	servers, searches, options = []string{}, []string{}, []string{}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		fields := strings.Fields(string(line))
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			if len(fields) >= 2 {
				servers = append(servers, fields[1])
			}
		case "search":
			searches = []string{}
			for _, s := range fields[1:] {
				searches = append(searches, strings.TrimSuffix(s, "."))
			}
		case "options":
			options = fields[1:]
		}
	}
	return servers, searches, options, nil
}

func omitDuplicates(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// mergeDNSOptions is the kubelet's: the pod's options replace the ones
// of the same name. Unlike the kubelet's (a map's order), the result is
// in a stable order: the existing names first, then the pod's new ones.
func mergeDNSOptions(existing []string, pod []corev1.PodDNSConfigOption) []string {
	var names []string
	values := map[string]string{}
	set := func(name, value string) {
		if _, ok := values[name]; !ok {
			names = append(names, name)
		}
		values[name] = value
	}
	for _, op := range existing {
		name, value, _ := strings.Cut(op, ":")
		set(name, value)
	}
	for _, op := range pod {
		value := ""
		if op.Value != nil {
			value = *op.Value
		}
		set(op.Name, value)
	}
	out := []string{}
	for _, n := range names {
		if v := values[n]; v != "" {
			out = append(out, n+":"+v)
		} else {
			out = append(out, n)
		}
	}
	return out
}

// searchFitsLimits is the kubelet's formDNSSearchFitsLimits.
func searchFitsLimits(s []string) ([]string, bool) {
	cut := false
	if len(s) > maxDNSSearchPaths {
		s, cut = s[:maxDNSSearchPaths], true
	}
	var kept []string
	for _, d := range s {
		if len(d) > maxDNSSearchLength {
			cut = true
			continue
		}
		kept = append(kept, d)
	}
	for len(strings.Join(kept, " ")) > maxDNSSearchListChars {
		kept, cut = kept[:len(kept)-1], true
	}
	return kept, cut
}

// hostnameAndDomain is the kubelet's GeneratePodHostNameAndDomain: the
// pod's hostname (its name by default, cut to 63 characters) and, with a
// subdomain, <subdomain>.<namespace>.svc.<cluster domain>.
func (pr *podRun) hostnameAndDomain() (string, string) {
	pod := pr.pod
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if len(hostname) > 63 {
		hostname = strings.TrimRight(hostname[:63], "-.")
	}
	domain := ""
	if pod.Spec.Subdomain != "" {
		domain = pod.Spec.Subdomain + "." + pod.Namespace + ".svc." + pr.b.cfg.ClusterDomain
	}
	return hostname, domain
}

// sandboxHostname is the kubelet's GetNodenameForKernel: the FQDN when
// the pod sets setHostnameAsFQDN and has a domain.
func (pr *podRun) sandboxHostname() string {
	hostname, domain := pr.hostnameAndDomain()
	if f := pr.pod.Spec.SetHostnameAsFQDN; f != nil && *f && domain != "" {
		return hostname + "." + domain
	}
	return hostname
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
		hostname, domain := pr.hostnameAndDomain()
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
