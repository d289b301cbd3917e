package plugins

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// semverRE is the regular expression semver.org gives for a semantic
// version, the form the DRA API accepts in a version attribute.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// numericTripleRE is a version of three numbers that semver refuses only
// for leading zeros, such as NVIDIA's "550.90.07".
var numericTripleRE = regexp.MustCompile(`^\d+\.\d+\.\d+$`)

// VersionAttr returns v as a version attribute when it is a semantic
// version, and as a string attribute otherwise. Three numbers with leading
// zeros ("550.90.07") are the same version without them ("550.90.7"), as
// the driver's own tools compare them; anything else that is not a
// semantic version ("535.104", "6.8.0-rc1.x!") stays a string.
func VersionAttr(v string) deviceplugin.Attribute {
	if semverRE.MatchString(v) {
		return deviceplugin.VersionAttr(v)
	}
	if numericTripleRE.MatchString(v) {
		parts := strings.Split(v, ".")
		for i, p := range parts {
			n, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				return deviceplugin.StringAttr(v)
			}
			parts[i] = strconv.FormatUint(n, 10)
		}
		return deviceplugin.VersionAttr(strings.Join(parts, "."))
	}
	return deviceplugin.StringAttr(v)
}
