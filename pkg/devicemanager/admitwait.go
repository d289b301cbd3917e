package devicemanager

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
)

// admitHeld is Admit with Config.AdmissionWait: the admission waits for
// the plugins of the resources pod requests (waitForPlugins). One that
// failed because a plugin went away meanwhile (a resource awaited again
// after it, or an Allocate that found its plugin going away:
// pluginGoingAway) waits for the plugin to be back and is tried again,
// within the same wait.
func (m *Manager) admitHeld(ctx context.Context, pod *corev1.Pod) (*PodAllocation, error) {
	deadline := m.cfg.Clock.Now().Add(m.cfg.AdmissionWait)
	for {
		m.waitForPlugins(ctx, pod, deadline)
		// Subscribed before the admission: the plugin's going away
		// notifies after its Allocate failed.
		changed, cancel := m.Subscribe()
		pa, err := m.admit(ctx, pod)
		retry := err != nil && ctx.Err() == nil && m.cfg.Clock.Now().Before(deadline)
		switch {
		case !retry:
		case len(m.awaitedResources(pod)) > 0:
			// A plugin went away between the wait and the admission:
			// waitForPlugins holds it again.
			m.log.Info("Holding a pod's admission: a plugin went away while it was admitted", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			cancel()
			continue
		case pluginGoingAway(ctx, err):
			m.log.Info("Holding a pod's admission: a plugin went away during its Allocate", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			timer := m.cfg.Clock.NewTimer(deadline.Sub(m.cfg.Clock.Now()))
			select {
			case <-changed:
			case <-timer.C():
			case <-ctx.Done():
			}
			timer.Stop()
			cancel()
			continue
		}
		cancel()
		return pa, err
	}
}

// pluginGoingAway reports whether an admission failed because its
// plugin's connection went away during Allocate: the plugin answered
// Unavailable (it is in its graceful stop), or the manager closed the
// connection of a plugin that went away (Canceled, while the admission's
// own ctx goes on).
func pluginGoingAway(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		return ctx.Err() == nil
	}
	return false
}

// waitForPlugins holds pod's admission, until deadline, while a resource
// it requests is known to the manager but not served by its plugin:
// restored from the checkpoint after a restart and not registered again,
// or whose plugins all went away within the grace period, or registered
// without having listed its devices since. A resource the manager does
// not know is not waited for: it was never served here, or its plugin has
// been gone longer than the grace period. Admission then goes on with
// what there is, and refuses as the kubelet would.
func (m *Manager) waitForPlugins(ctx context.Context, pod *corev1.Pod, deadline time.Time) {
	changed, cancel := m.Subscribe()
	defer cancel()
	timer := m.cfg.Clock.NewTimer(deadline.Sub(m.cfg.Clock.Now()))
	defer timer.Stop()
	start := m.cfg.Clock.Now()
	var held []string
	defer func() {
		m.mu.Lock()
		if _, ok := m.held[string(pod.UID)]; ok {
			delete(m.held, string(pod.UID))
			m.notifyLocked()
		}
		m.mu.Unlock()
	}()
	for {
		waiting := m.awaitedResources(pod)
		if len(waiting) == 0 {
			if held != nil {
				m.log.Info("Admitting a held pod: its resources' plugins serve them again", "pod", pod.Namespace+"/"+pod.Name, "resources", held, "waited", m.cfg.Clock.Since(start).Round(time.Millisecond))
			}
			return
		}
		if held == nil {
			held = waiting
			m.mu.Lock()
			m.held[string(pod.UID)] = pod.Namespace + "/" + pod.Name
			m.notifyLocked()
			m.mu.Unlock()
			m.log.Info("Holding a pod's admission until the plugins of the resources it requests serve them again", "pod", pod.Namespace+"/"+pod.Name, "resources", waiting, "until", deadline)
		}
		select {
		case _, ok := <-changed:
			if !ok {
				return // the manager stops
			}
		case <-timer.C():
			m.log.Warn("Admitting a held pod without its resources' plugins: the admission wait ended", "pod", pod.Namespace+"/"+pod.Name, "resources", waiting, "waited", m.cfg.Clock.Since(start).Round(time.Millisecond))
			return
		case <-ctx.Done():
			return
		}
	}
}

// awaitedResources are the resources pod requests whose plugins are
// awaited: known, and not listed by a plugin since they last lost all of
// theirs.
func (m *Manager) awaitedResources(pod *corev1.Pod) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, rn := range extendedRequests(pod) {
		if r := m.resources[rn]; r != nil && !r.reported && !m.stopping {
			out = append(out, rn)
		}
	}
	return out
}

// HeldPods are the pods whose admission waits for their resources'
// plugins (Config.AdmissionWait), as "namespace/name", sorted.
func (m *Manager) HeldPods() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for _, p := range m.held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
