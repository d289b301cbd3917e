package podruntime

import (
	"context"

	corev1 "k8s.io/api/core/v1"
)

// Env is a container's environment in order, as the kubelet builds it
// (makeEnvironmentVariables): a variable set again keeps its place and
// takes the new value. The zero value is empty and ready.
type Env struct {
	vars  map[string]string
	order []string
}

// Set sets k to v.
func (e *Env) Set(k, v string) {
	if e.vars == nil {
		e.vars = map[string]string{}
	}
	if _, ok := e.vars[k]; !ok {
		e.order = append(e.order, k)
	}
	e.vars[k] = v
}

// Has reports whether k is set.
func (e *Env) Has(k string) bool {
	_, ok := e.vars[k]
	return ok
}

// Vars are the variables by name, what $(VAR) references expand to.
func (e *Env) Vars() map[string]string { return e.vars }

// Names are the variables' names in order.
func (e *Env) Names() []string { return e.order }

// Get is the value of k.
func (e *Env) Get(k string) string { return e.vars[k] }

// Expand expands the $(VAR) references of each of args (command or args)
// with the variables.
func (e *Env) Expand(args []string) []string {
	var out []string
	for _, a := range args {
		out = append(out, Expand(a, e.vars))
	}
	return out
}

// ContainerEnvFunc returns the environment the node gives a container
// beyond the literal values of its spec (backend.Config.ContainerEnv).
type ContainerEnvFunc func(ctx context.Context, pod *corev1.Pod, container string) ([]corev1.EnvVar, error)

// AddContainerEnv adds c's environment to e as the kubelet builds it: the
// literal values of c.Env, each with $(VAR) references to the variables
// before it expanded, then what resolve returns (the values resolved from
// Secrets, ConfigMaps, the downward API and Services, then the device
// plugins' variables) but the names skip reports. resolve and skip may be
// nil.
func (e *Env) AddContainerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, resolve ContainerEnvFunc, skip func(name string) bool) error {
	for _, v := range c.Env {
		if v.ValueFrom == nil {
			e.Set(v.Name, Expand(v.Value, e.vars))
		}
	}
	if resolve == nil {
		return nil
	}
	extra, err := resolve(ctx, pod, c.Name)
	if err != nil {
		return err
	}
	for _, v := range extra {
		if skip == nil || !skip(v.Name) {
			e.Set(v.Name, v.Value)
		}
	}
	return nil
}
