package devicemanager

import "github.com/dpkit/dpkit/pkg/topology"

// device is one device of a resource as last reported by its plugin.
type device struct {
	id      string
	healthy bool
	mask    topology.Mask
	numa    []int64 // NUMA node IDs as reported, for read APIs
	// poolIdx is the device's index in the free pool of its mask, -1 when
	// it is not free (unhealthy or in use).
	poolIdx int
	// gen is the last ListAndWatch message that listed the device.
	gen uint64
}

// pool is a set of free devices with O(1) insert, remove and pick.
type pool struct {
	devs []*device
}

func (p *pool) add(d *device) {
	d.poolIdx = len(p.devs)
	p.devs = append(p.devs, d)
}

func (p *pool) remove(d *device) {
	i := d.poolIdx
	last := len(p.devs) - 1
	p.devs[i] = p.devs[last]
	p.devs[i].poolIdx = i
	p.devs[last] = nil
	p.devs = p.devs[:last]
	d.poolIdx = -1
}
