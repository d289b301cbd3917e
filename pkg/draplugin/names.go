package draplugin

import "github.com/dpkit/dpkit/pkg/resourcename"

// DeviceName returns the ResourceSlice device name of a device ID:
// resourcename.DRADeviceName, where the rule lives so that code without
// the DRA front (a device plugin that withholds what claims hold) names
// devices the same way.
func DeviceName(id string) string { return resourcename.DRADeviceName(id) }
