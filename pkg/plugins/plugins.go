// Package plugins holds what dpkit's ready plugins share. Each plugin lives
// in its own subpackage (fake, generic, amdgpu, nvidia) and exposes the same
// shape:
//
//	type Config struct{ ... }                                   // its section of the config file
//	func (c *Config) Default()                                  // fills unset fields
//	func (c *Config) Validate(p *field.Path) field.ErrorList    // every problem, with its field path
//	func New(cfg Config, opts plugins.Options) ([]deviceplugin.Resource, error)
package plugins

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
)

// Options are the host dependencies handed to every plugin. Plugins read
// the host only below these roots, so they run against fixture trees.
type Options struct {
	// SysfsRoot, DevRoot and ProcRoot are where the host's /sys, /dev and
	// /proc are mounted; "" means the real paths.
	SysfsRoot string
	DevRoot   string
	ProcRoot  string
	// Logger receives the plugin's logs; nil discards them.
	Logger *slog.Logger
}

// Defaults returns o with empty roots set to /sys, /dev and /proc and a
// discarding logger when none is set.
func (o Options) Defaults() Options {
	if o.SysfsRoot == "" {
		o.SysfsRoot = "/sys"
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Duration is a time.Duration written in config files as a string such as
// "5s" or "1m30s". Plugins use it instead of apimachinery's plugins.Duration
// to keep the plugin binary free of the Kubernetes object machinery.
type Duration struct {
	time.Duration
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// UnmarshalJSON reads a string such as "5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"5s\" or \"1m30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration; use a string such as \"5s\" or \"1m30s\"", s)
	}
	d.Duration = v
	return nil
}
