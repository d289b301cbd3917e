package podruntime

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

// DNS is the node's DNS settings, as the kubelet's --cluster-dns,
// --cluster-domain and --resolv-conf.
type DNS struct {
	ClusterDNS    []string
	ClusterDomain string
	// ResolvConf is the node's resolver configuration; empty means
	// DefaultResolvConf.
	ResolvConf string
}

// PodDNS is a pod's resolver configuration.
type PodDNS struct {
	Servers, Searches, Options []string
}

// ForPod is the kubelet's GetPodDNS (pkg/kubelet/network/dns): the
// host's resolv.conf for Default (and for ClusterFirst on the host
// network), the cluster DNS servers and search path for ClusterFirst and
// ClusterFirstWithHostNet, nothing for None; then the pod's dnsConfig
// appended; then the resolver's limits. A ClusterFirst pod on a node
// without cluster DNS servers falls back to Default, with the kubelet's
// warning event, given to event as the others.
func (cfg DNS) ForPod(pod *corev1.Pod, event func(eventType, reason, message string)) (PodDNS, error) {
	resolv := cfg.ResolvConf
	if resolv == "" {
		resolv = DefaultResolvConf
	}
	servers, searches, options, err := readResolvConf(resolv)
	if err != nil {
		return PodDNS{}, err
	}
	dc := PodDNS{Servers: servers, Searches: searches, Options: options}
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	cluster := policy == corev1.DNSClusterFirstWithHostNet || (policy == corev1.DNSClusterFirst && !pod.Spec.HostNetwork)
	switch {
	case policy == corev1.DNSNone:
		dc = PodDNS{}
	case cluster && len(cfg.ClusterDNS) > 0:
		dc.Servers = slices.Clone(cfg.ClusterDNS)
		if d := cfg.ClusterDomain; d != "" {
			dc.Searches = omitDuplicates(append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, dc.Searches...))
		}
		dc.Options = []string{"ndots:5"}
	case cluster:
		event(corev1.EventTypeWarning, EventMissingClusterDNS, MissingClusterDNSMessage(pod))
	}
	if pc := pod.Spec.DNSConfig; pc != nil {
		dc.Servers = omitDuplicates(append(dc.Servers, pc.Nameservers...))
		dc.Searches = omitDuplicates(append(dc.Searches, pc.Searches...))
		dc.Options = mergeDNSOptions(dc.Options, pc.Options)
	}
	if len(dc.Servers) > maxDNSNameservers {
		dc.Servers = dc.Servers[:maxDNSNameservers]
		event(corev1.EventTypeWarning, EventDNSConfigForming, NameserversOmittedMessage(dc.Servers))
	}
	if s, cut := searchFitsLimits(dc.Searches); cut {
		dc.Searches = s
		event(corev1.EventTypeWarning, EventDNSConfigForming, SearchesOmittedMessage(s))
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

// HostnameAndDomain is the kubelet's GeneratePodHostNameAndDomain: the
// pod's hostname (its name by default, cut to 63 characters) and, with a
// subdomain, <subdomain>.<namespace>.svc.<cluster domain>.
func (cfg DNS) HostnameAndDomain(pod *corev1.Pod) (string, string) {
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if len(hostname) > 63 {
		hostname = strings.TrimRight(hostname[:63], "-.")
	}
	domain := ""
	if pod.Spec.Subdomain != "" {
		domain = pod.Spec.Subdomain + "." + pod.Namespace + ".svc." + cfg.ClusterDomain
	}
	return hostname, domain
}

// KernelHostname is the kubelet's GetNodenameForKernel: the hostname,
// or the FQDN when the pod sets setHostnameAsFQDN and has a domain.
func (cfg DNS) KernelHostname(pod *corev1.Pod) string {
	hostname, domain := cfg.HostnameAndDomain(pod)
	if f := pod.Spec.SetHostnameAsFQDN; f != nil && *f && domain != "" {
		return hostname + "." + domain
	}
	return hostname
}
