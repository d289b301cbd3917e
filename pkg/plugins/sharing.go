package plugins

import (
	"fmt"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// SharePolicy is how a share of a shared device asks for a capacity, as a
// plugin config file writes it: Default when it asks nothing (default: the
// whole capacity, down to Min plus whole steps, as the DRA API wants it),
// an amount asked rounded up to Min + n*Step (Step default 1, Min default
// Step). Amounts are whole-number quantities
// (ParseAmount).
type SharePolicy struct {
	Default string `json:"default,omitempty"`
	Min     string `json:"min,omitempty"`
	Step    string `json:"step,omitempty"`
}

// Check checks what does not depend on the capacity's total: every
// amount parses, Step is above 0, and a Default given is Min plus whole
// steps. An error names the policy's field.
func (p SharePolicy) Check() error {
	c, err := p.amounts(0)
	if err != nil {
		return err
	}
	switch {
	case c.Step < 1:
		return fmt.Errorf("step must be more than 0")
	case p.Default != "" && c.Default < c.Min:
		return fmt.Errorf("default must be at least min")
	case p.Default != "" && (c.Default-c.Min)%c.Step != 0:
		return fmt.Errorf("default must be min plus a whole number of steps")
	}
	return nil
}

// amounts parses the policy's amounts for a capacity of total.
func (p SharePolicy) amounts(total int64) (deviceplugin.SharedCapacity, error) {
	c := deviceplugin.SharedCapacity{Total: total, Default: total, Step: 1}
	for _, f := range []struct {
		name, v string
		to      *int64
	}{{"step", p.Step, &c.Step}, {"min", p.Min, &c.Min}, {"default", p.Default, &c.Default}} {
		if f.v == "" {
			continue
		}
		v, err := ParseAmount(f.v)
		if err != nil {
			return c, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.to = v
	}
	if p.Min == "" {
		c.Min = c.Step
	}
	return c, nil
}

// Capacity reads the policy for a capacity whose total is total (written
// totalText in errors) and checks that the DRA API takes it: a
// requestPolicy whose min and one step fit the capacity, and a default
// that is min plus whole steps. An error names the policy's field.
func (p SharePolicy) Capacity(total int64, totalText string) (deviceplugin.SharedCapacity, error) {
	c, err := p.amounts(total)
	if err != nil {
		return c, err
	}
	if p.Default == "" && c.Step > 0 && c.Default > c.Min {
		c.Default = c.Min + (c.Default-c.Min)/c.Step*c.Step
	}
	switch {
	case c.Step < 1:
		return c, fmt.Errorf("step must be more than 0")
	case c.Min+c.Step > total:
		return c, fmt.Errorf("min and one step (%d) must not exceed the capacity (%s)", c.Min+c.Step, totalText)
	case c.Default < c.Min || c.Default > total:
		return c, fmt.Errorf("default must be between min and the capacity (%s)", totalText)
	case (c.Default-c.Min)%c.Step != 0:
		return c, fmt.Errorf("default must be min plus a whole number of steps")
	}
	return c, nil
}

// ReplicaAmount is what one of replicas equal replicas of a shared
// capacity takes: an equal part, rounded down to the policy's granule. It
// is below c.Min when the capacity is too small for that many replicas.
func ReplicaAmount(c deviceplugin.SharedCapacity, replicas int) int64 {
	part := c.Total / int64(max(replicas, 1))
	step := max(c.Step, 1)
	if part < c.Min {
		return part
	}
	return c.Min + (part-c.Min)/step*step
}
