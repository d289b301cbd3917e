package fake

import (
	"fmt"
	"maps"
	"regexp"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// The attributes of the devices of a partitioned resource: every device
// has PartitionAttribute (false on the whole device, true on its
// partitions), and a partition its ProfileAttribute and ParentAttribute,
// the ID of the device it is part of.
const (
	PartitionAttribute = "partition"
	ProfileAttribute   = "profile"
	ParentAttribute    = "parent"
)

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// partitioned reports whether the resource's devices share anything.
func (r ResourceConfig) partitioned() bool { return len(r.Partitions) > 0 || len(r.Shared) > 0 }

// replicaID names replica n of device id, as nvidia's are named.
func replicaID(id string, n int) string { return fmt.Sprintf("%s::%d", id, n) }

// partitionID names partition n of a profile of device id.
func partitionID(id, profile string, n int) string { return fmt.Sprintf("%s-%s-%d", id, profile, n) }

// validateSharing checks partitions and shared against capacity.
func (r ResourceConfig) validateSharing(rp *field.Path) field.ErrorList {
	var errs field.ErrorList
	capacity := map[string]int64{}
	for _, n := range slices.Sorted(maps.Keys(r.Capacity)) {
		if v, err := plugins.ParseAmount(r.Capacity[n]); err == nil {
			capacity[n] = v
		} else if r.partitioned() {
			errs = append(errs, field.Invalid(rp.Child("capacity").Key(n), r.Capacity[n], "a device that is partitioned or shared needs whole-number capacities: "+err.Error()))
		}
	}
	if r.partitioned() && len(r.Capacity) == 0 {
		errs = append(errs, field.Required(rp.Child("capacity"), "partitions and shares take from the device's capacity; give it, e.g. {memory: 80Gi, slices: 7}"))
	}
	if len(r.Partitions) > 0 {
		for _, n := range []string{PartitionAttribute, ProfileAttribute, ParentAttribute} {
			if _, ok := r.Attributes[n]; ok {
				errs = append(errs, field.Forbidden(rp.Child("attributes").Key(n), "the devices of a partitioned resource get "+n+" from the plugin; use another name"))
			}
		}
		if n := len(r.Attributes) + len(r.Capacity) + 4; n > maxAttributes {
			errs = append(errs, field.Invalid(rp.Child("attributes"), len(r.Attributes), fmt.Sprintf("a partition device has index, partition, profile and parent besides these: %d attributes and capacities, at most %d; remove some", n, maxAttributes)))
		}
	}
	errs = append(errs, r.validatePartitions(rp, capacity)...)
	for _, n := range slices.Sorted(maps.Keys(r.Shared)) {
		sp := rp.Child("shared").Key(n)
		total, ok := capacity[n]
		if !ok {
			errs = append(errs, field.NotFound(sp, n+" (a share takes part of a capacity of the resource; add it there)"))
			continue
		}
		if _, err := r.sharedCapacity(n, total); err != nil {
			errs = append(errs, field.Invalid(sp, r.Shared[n], err.Error()))
		}
	}
	switch {
	case r.Replicas < 0 || r.Replicas > 64:
		errs = append(errs, field.Invalid(rp.Child("replicas"), r.Replicas, "must be between 1 and 64, or left out"))
	case r.Replicas > 0 && len(r.Shared) == 0:
		errs = append(errs, field.Required(rp.Child("shared"), "replicas are shares of a shared device: say which capacities they share, e.g. {memory: {min: 1Gi}}"))
	case r.Replicas > 0:
		for _, n := range slices.Sorted(maps.Keys(r.Shared)) {
			c, err := r.sharedCapacity(n, capacity[n])
			if err == nil && plugins.ReplicaAmount(c, r.Replicas) < c.Min {
				errs = append(errs, field.Invalid(rp.Child("replicas"), r.Replicas, fmt.Sprintf("a replica's share of %s (%s/%d) is below the share policy's min", n, r.Capacity[n], r.Replicas)))
			}
		}
	}
	if len(r.Partitions) > 0 {
		// What the DRA API takes: one device per partition, every
		// device of a slice consuming counters, 64 per slice.
		if per := 1 + sumCounts(r.Partitions); per*r.Count > 100_000 {
			errs = append(errs, field.Invalid(rp.Child("partitions"), per, fmt.Sprintf("%d devices with their partitions is too many; at most 100000", per*r.Count)))
		}
	}
	return errs
}

// validatePartitions checks each partition profile against the device's
// capacity.
func (r ResourceConfig) validatePartitions(rp *field.Path, capacity map[string]int64) field.ErrorList {
	var errs field.ErrorList
	profiles := map[string]bool{}
	for i, pc := range r.Partitions {
		pp := rp.Child("partitions").Index(i)
		switch {
		case !dnsLabelRE.MatchString(pc.Profile) || len(pc.Profile) > 40:
			errs = append(errs, field.Invalid(pp.Child("profile"), pc.Profile, "must be a DNS label of at most 40 characters (lower case, digits, '-'), e.g. 1g-10gb"))
		case profiles[pc.Profile]:
			errs = append(errs, field.Duplicate(pp.Child("profile"), pc.Profile))
		}
		profiles[pc.Profile] = true
		if pc.Count < 1 || pc.Count > 64 {
			errs = append(errs, field.Invalid(pp.Child("count"), pc.Count, "must be between 1 and 64: how many partitions of the profile fit one device"))
		}
		if len(pc.Consumes) == 0 {
			errs = append(errs, field.Required(pp.Child("consumes"), "what one partition takes of the device's capacity, e.g. {memory: 10Gi, slices: 1}"))
		}
		for _, n := range slices.Sorted(maps.Keys(pc.Consumes)) {
			cp := pp.Child("consumes").Key(n)
			v, err := plugins.ParseAmount(pc.Consumes[n])
			total, ok := capacity[n]
			switch {
			case err != nil:
				errs = append(errs, field.Invalid(cp, pc.Consumes[n], err.Error()))
			case !ok:
				errs = append(errs, field.NotFound(cp, n+" (partitions take from the resource's capacity; add it there)"))
			case !dnsLabelRE.MatchString(n):
				errs = append(errs, field.Invalid(cp, n, "a capacity partitions take is a counter, whose name must be a DNS label (lower case, digits, '-')"))
			case v <= 0 || v > total:
				errs = append(errs, field.Invalid(cp, pc.Consumes[n], fmt.Sprintf("must be more than 0 and at most the device's %s", r.Capacity[n])))
			}
		}
	}
	return errs
}

func sumCounts(ps []PartitionConfig) int {
	n := 0
	for _, p := range ps {
		n += p.Count
	}
	return n
}

// sharedCapacity reads the policy of shared capacity n of a device whose
// total is total.
func (r ResourceConfig) sharedCapacity(n string, total int64) (deviceplugin.SharedCapacity, error) {
	return r.Shared[n].Capacity(total, r.Capacity[n])
}

// sharing is the resource's sharing rules, read once from the validated
// config.
type sharing struct {
	replica    map[string]int64                 // what a replica takes of each shared capacity
	whole      *deviceplugin.Sharing            // the rules of every whole device but its counter set's name
	partitions map[string]*deviceplugin.Sharing // profile -> rules but the set's name
	counters   map[string]int64                 // every device's counter totals
	capacity   map[string]int64
}

func (r ResourceConfig) sharing() *sharing {
	if !r.partitioned() {
		return nil
	}
	s := &sharing{partitions: map[string]*deviceplugin.Sharing{}, counters: map[string]int64{}, capacity: map[string]int64{}}
	for n, v := range r.Capacity {
		s.capacity[n], _ = plugins.ParseAmount(v)
	}
	for _, pc := range r.Partitions {
		use := map[string]int64{}
		for n, v := range pc.Consumes {
			use[n], _ = plugins.ParseAmount(v)
			s.counters[n] = s.capacity[n]
		}
		s.partitions[pc.Profile] = &deviceplugin.Sharing{Consumes: []deviceplugin.CounterUse{{Counters: use}}}
	}
	s.whole = &deviceplugin.Sharing{}
	if len(s.counters) > 0 {
		s.whole.Consumes = []deviceplugin.CounterUse{{Counters: maps.Clone(s.counters)}}
	}
	if len(r.Shared) > 0 {
		s.whole.Shared = map[string]deviceplugin.SharedCapacity{}
		for n := range r.Shared {
			s.whole.Shared[n], _ = r.sharedCapacity(n, s.capacity[n])
		}
	}
	if r.Replicas > 0 {
		s.replica = map[string]int64{}
		for n, c := range s.whole.Shared {
			s.replica[n] = plugins.ReplicaAmount(c, r.Replicas)
		}
	}
	return s
}

// of returns rules with the counter set named after the device.
func of(rules *deviceplugin.Sharing, set string) *deviceplugin.Sharing {
	out := *rules
	out.Consumes = nil
	for _, use := range rules.Consumes {
		out.Consumes = append(out.Consumes, deviceplugin.CounterUse{Set: set, Counters: use.Counters})
	}
	return &out
}

var _ deviceplugin.CounterSetter = (*Plugin)(nil)

// CounterSets returns one counter set per partitioned device, named after
// it: the device's capacities its partitions take.
func (p *Plugin) CounterSets() []deviceplugin.CounterSet {
	if p.share == nil || len(p.share.counters) == 0 {
		return nil
	}
	out := make([]deviceplugin.CounterSet, 0, p.cfg.Count)
	for i := range p.cfg.Count {
		out = append(out, deviceplugin.CounterSet{Name: deviceID(p.cfg.IDPattern, i), Counters: maps.Clone(p.share.counters)})
	}
	return out
}
