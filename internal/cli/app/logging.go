package app

import (
	"context"
	"log/slog"
)

// componentKey is the attribute that names the part of dpkit a log line
// comes from. Components nest (dpkit up's kubelet runs a device manager):
// the line carries one component, the path "kubelet/devicemanager", as
// Kubernetes' logger names do, rather than the key twice.
const componentKey = "component"

// componentHandler joins nested component attributes into one path.
type componentHandler struct {
	next      slog.Handler
	component string
}

func (h *componentHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *componentHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.component != "" {
		r = r.Clone()
		r.AddAttrs(slog.String(componentKey, h.component))
	}
	return h.next.Handle(ctx, r)
}

func (h *componentHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	rest := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if a.Key != componentKey {
			rest = append(rest, a)
			continue
		}
		if c.component == "" {
			c.component = a.Value.String()
		} else {
			c.component += "/" + a.Value.String()
		}
	}
	if len(rest) > 0 {
		c.next = c.next.WithAttrs(rest)
	}
	return &c
}

func (h *componentHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = c.next.WithGroup(name)
	return &c
}
