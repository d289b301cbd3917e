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
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/dpkit/dpkit/pkg/configfile"
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

// Duration is the duration type of every dpkit configuration file, a
// string such as "5s" or "1m30s" (configfile.Duration).
type Duration = configfile.Duration

// Sharing names the IDs a plugin advertises for a device that N
// containers may share: <id><Sep>0 ... <id><Sep>(N-1). With N of 0 or 1 the
// device is not shared and is advertised as id alone. The generic plugin
// shares with "-" (count), the nvidia plugin with "::" (replicas).
type Sharing struct {
	N   int
	Sep string
}

// Shared reports whether devices are advertised as several IDs.
func (s Sharing) Shared() bool { return s.N > 1 }

// IDs returns the IDs advertised for device id.
func (s Sharing) IDs(id string) []string {
	if !s.Shared() {
		return []string{id}
	}
	out := make([]string, s.N)
	for i := range out {
		out[i] = id + s.Sep + strconv.Itoa(i)
	}
	return out
}

// Device returns the device behind an advertised ID: the ID up to its
// last separator when devices are shared, the ID itself otherwise.
func (s Sharing) Device(id string) string {
	if !s.Shared() {
		return id
	}
	if i := strings.LastIndex(id, s.Sep); i > 0 {
		return id[:i]
	}
	return id
}

// quantityRE is the syntax of a Kubernetes quantity ("80Gi", "1.5", "2e3",
// "500m"): a signed decimal number and an optional binary (Ki..Ei),
// decimal (n, u, m, k, M..E) or exponent suffix, as resource.ParseQuantity
// accepts. It is checked here without k8s.io/apimachinery's quantity
// package, which would add a megabyte to the lean plugin binary.
var quantityRE = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$`)

// ValidQuantity reports whether s is a Kubernetes quantity, such as
// "80Gi" or "500m".
func ValidQuantity(s string) bool { return quantityRE.MatchString(s) }

// amountRE is a whole-number quantity: digits and an optional binary or
// decimal multiplier.
var amountRE = regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$`)

var amountUnits = map[string]int64{
	"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
	"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}

// ParseAmount reads a quantity that is a whole number of base units, such
// as "80Gi" or "7", as sharing rules take them (deviceplugin.Sharing).
// The error says what is accepted.
func ParseAmount(s string) (int64, error) {
	m := amountRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a whole-number quantity: write digits and an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E), e.g. 80Gi or 7", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	unit := amountUnits[m[2]]
	if err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("%q is too large: at most %d base units", s, int64(math.MaxInt64))
	}
	return n * unit, nil
}
