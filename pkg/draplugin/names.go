package draplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DeviceName returns the ResourceSlice device name of a device ID: a DNS
// label derived from it. Lowercase letters and digits are kept, uppercase
// letters are lowered and every run of other characters becomes one '-',
// with '-' trimmed from both ends. When that changed the ID, or left it
// empty or longer than 63 characters, a '-' and the first 10 hex digits of
// the ID's SHA-256 are appended (the name cut to fit), so two IDs that
// clean up the same still get different names. The same ID always gets
// the same name.
func DeviceName(id string) string {
	var b strings.Builder
	dash := false
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r - 'A' + 'a')
			dash = false
		default:
			if !dash {
				b.WriteByte('-')
				dash = true
			}
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == id && len(name) <= 63 && name != "" {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	suffix := hex.EncodeToString(sum[:5])
	const keep = 63 - 1 - 10
	if len(name) > keep {
		name = strings.TrimRight(name[:keep], "-")
	}
	if name == "" {
		return "d-" + suffix
	}
	return name + "-" + suffix
}
