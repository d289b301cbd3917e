package deviceplugin

import (
	"fmt"
	"strings"
	"testing"
)

func TestCheckDevices(t *testing.T) {
	t.Parallel()
	dev := func(id string, healthy bool, numa ...int64) Device {
		return Device{ID: id, Healthy: healthy, NUMANodes: numa}
	}
	many := make([]Device, 0, 20)
	for i := range 20 {
		many = append(many, dev(fmt.Sprintf("d%d", i%10), true))
	}
	tests := []struct {
		name string
		devs []Device
		want string // the whole error; "" for none
	}{
		{name: "none", devs: nil},
		{name: "unique", devs: []Device{dev("a", true, 0), dev("b", false)}},
		{name: "one ID twice", devs: []Device{dev("dongle0", true, 0), dev("dongle1", true, 0), dev("dongle0", false, 1)},
			want: `device ID "dongle0" is listed twice: devices[0] (healthy, NUMA nodes [0]) and devices[2] (unhealthy, NUMA nodes [1]); give every device its own ID`},
		{name: "identical entries", devs: []Device{dev("a", true), dev("a", true)},
			want: `device ID "a" is listed twice: devices[0] (healthy, no NUMA node) and devices[1] (healthy, no NUMA node); give every device its own ID`},
		{name: "three times, and two IDs", devs: []Device{dev("a", true), dev("b", true), dev("a", true), dev("b", true), dev("a", false)},
			want: `device ID "a" is listed twice: devices[0] (healthy, no NUMA node) and devices[2] (healthy, no NUMA node); give every device its own ID` + "\n" +
				`device ID "b" is listed twice: devices[1] (healthy, no NUMA node) and devices[3] (healthy, no NUMA node); give every device its own ID` + "\n" +
				`device ID "a" is listed twice: devices[0] (healthy, no NUMA node) and devices[4] (unhealthy, no NUMA node); give every device its own ID`},
		{name: "more than are named", devs: many},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := checkDevices(tt.devs)
			switch {
			case tt.name == "more than are named":
				if err == nil || strings.Count(err.Error(), "is listed twice") != maxDuplicates ||
					!strings.HasSuffix(err.Error(), "\nand 5 more entries repeat an ID listed before them") {
					t.Errorf("checkDevices = %v, want %d duplicates named and the 5 others counted", err, maxDuplicates)
				}
			case tt.want == "" && err != nil:
				t.Errorf("checkDevices = %v, want nil", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("checkDevices = %v\nwant %s", err, tt.want)
			}
		})
	}
}
