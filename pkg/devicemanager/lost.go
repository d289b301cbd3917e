package devicemanager

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ErrUnknownHolders is wrapped by the admission error of a pod asking for
// a resource whose devices may be held by pods the manager cannot account
// for (see HoldUnknown).
var ErrUnknownHolders = errors.New("devices held by earlier pods are unknown")

// HoldUnknown tells the manager which pods were running when the host
// started. It matters only when the checkpoint could not be read (corrupt,
// or not the kubelet's format): the devices those pods hold are then
// unknown, and handing them to a new pod would give one device to two
// pods (the kubelet does exactly that). Instead, admission of a resource
// any of those pods asks for is refused — with a message naming them —
// until every such pod is gone (RemovePod or RetainPods). Pods whose
// allocation the manager knows, and resources no such pod asks for, are
// not affected. Call it after Start; without a lost checkpoint it does
// nothing.
func (m *Manager) HoldUnknown(pods []*corev1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.checkpointLost {
		return
	}
	for _, p := range pods {
		uid := string(p.UID)
		if _, known := m.pods[uid]; known {
			continue
		}
		for _, rn := range extendedRequests(p) {
			if m.unknown == nil {
				m.unknown = make(map[string]map[string]string)
			}
			if m.unknown[rn] == nil {
				m.unknown[rn] = make(map[string]string)
			}
			m.unknown[rn][uid] = p.Namespace + "/" + p.Name
		}
	}
	for rn, holders := range m.unknown {
		m.log.Error("The device manager checkpoint was unreadable: refusing admissions of this resource until the pods that held its devices are gone",
			"resource", rn, "pods", sortedValues(holders))
	}
}

// CheckpointLost reports whether the checkpoint existed at Start but could
// not be read.
func (m *Manager) CheckpointLost() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkpointLost
}

// unknownHoldersLocked returns the error for a pod (uid) asking for rn
// while other pods may hold rn's devices unaccounted, or nil.
func (m *Manager) unknownHoldersLocked(uid, rn string) error {
	var others []string
	for holder, name := range m.unknown[rn] {
		if holder != uid {
			others = append(others, name)
		}
	}
	if len(others) == 0 {
		return nil
	}
	sort.Strings(others)
	return fmt.Errorf("%w: cannot allocate %s: the device manager checkpoint was unreadable at start, so the devices of %s held by pods admitted before it (%s) are not known; admission of %s resumes once those pods are gone",
		ErrUnknownHolders, rn, rn, strings.Join(others, ", "), rn)
}

// forgetUnknownLocked drops uid from the unknown holders.
func (m *Manager) forgetUnknownLocked(uid string) {
	for rn, holders := range m.unknown {
		delete(holders, uid)
		if len(holders) == 0 {
			delete(m.unknown, rn)
			m.log.Info("Admissions of the resource resume: the pods that held its devices before the checkpoint was lost are gone", "resource", rn)
		}
	}
}

func sortedValues(mp map[string]string) []string {
	out := make([]string, 0, len(mp))
	for _, v := range mp {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// extendedRequests returns the extended resources any container of pod
// asks for, whether or not a plugin serves them yet.
func extendedRequests(pod *corev1.Pod) []string {
	seen := make(map[string]struct{})
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for name, q := range rl {
					if q.Value() > 0 && IsExtendedResourceName(string(name)) && !IsDRAExtendedResource(pod, cs[i].Name, string(name)) {
						seen[string(name)] = struct{}{}
					}
				}
			}
		}
	}
	return sortedKeys(seen)
}
