package virtualnode

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// virtual-kubelet hands the provider pods whose containers' env it has
// resolved: every env entry and every key of every envFrom source becomes a
// literal value, Secrets' included, and envFrom is emptied. Kept as they
// are, those pods would carry Secrets' values into what the node serves
// (the node API's /pods) and stores (the process backend's state.json),
// where the kubelet serves the pod as the API server has it and keeps
// Secrets' values in memory only.
//
// So the provider keeps two things apart: the pod it stores, hands to the
// backend and serves has its containers' env and envFrom as the API server
// has them (references, not values); the resolved environment lives in
// podEnvs, in memory, and reaches the backend through
// backend.Config.ContainerEnv each time a container starts. After a
// restart of the node the resolved environment is gone until virtual-
// kubelet resolves the pod again (its first sync offers every pod to
// UpdatePod): containers that must start meanwhile wait for it.

// podEnvs holds the resolved environment of each pod's containers.
type podEnvs struct {
	mu   sync.Mutex
	pods map[types.UID]*podEnv
}

type podEnv struct {
	ready      chan struct{} // closed once containers is set
	containers map[string][]corev1.EnvVar
}

func (e *podEnvs) entry(uid types.UID) *podEnv {
	if e.pods == nil {
		e.pods = map[types.UID]*podEnv{}
	}
	pe, ok := e.pods[uid]
	if !ok {
		pe = &podEnv{ready: make(chan struct{})}
		e.pods[uid] = pe
	}
	return pe
}

// put records the resolved environment of every container of pod,
// replacing what was recorded, and wakes the containers waiting for it.
func (e *podEnvs) put(pod *corev1.Pod) {
	containers := map[string][]corev1.EnvVar{}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			containers[c.Name] = append([]corev1.EnvVar(nil), c.Env...)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	pe := e.entry(pod.UID)
	first := pe.containers == nil
	pe.containers = containers
	if first {
		close(pe.ready)
	}
}

// get returns the resolved environment of a container of the pod of uid,
// waiting until it is known or ctx ends.
func (e *podEnvs) get(ctx context.Context, uid types.UID, container string) ([]corev1.EnvVar, error) {
	e.mu.Lock()
	pe := e.entry(uid)
	e.mu.Unlock()
	select {
	case <-pe.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]corev1.EnvVar(nil), pe.containers[container]...), nil
}

// forget drops what is known of the pod of uid.
func (e *podEnvs) forget(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pods, uid)
}

// asInAPI returns a copy of resolved whose containers' env and envFrom are
// those of api, the pod as the API server has it (nil when the node no
// longer finds it there: the env is then left out altogether).
// virtual-kubelet's resolution changes nothing else.
func asInAPI(resolved, api *corev1.Pod) *corev1.Pod {
	out := resolved.DeepCopy()
	if api != nil && api.UID != resolved.UID {
		api = nil
	}
	fix := func(list []corev1.Container, from []corev1.Container) {
		for i := range list {
			list[i].Env, list[i].EnvFrom = nil, nil
			for _, c := range from {
				if c.Name != list[i].Name {
					continue
				}
				for _, e := range c.Env {
					list[i].Env = append(list[i].Env, *e.DeepCopy())
				}
				for _, e := range c.EnvFrom {
					list[i].EnvFrom = append(list[i].EnvFrom, *e.DeepCopy())
				}
			}
		}
	}
	var initFrom, appFrom []corev1.Container
	if api != nil {
		initFrom, appFrom = api.Spec.InitContainers, api.Spec.Containers
	}
	fix(out.Spec.InitContainers, initFrom)
	fix(out.Spec.Containers, appFrom)
	return out
}
