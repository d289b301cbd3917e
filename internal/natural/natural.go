// Package natural orders strings the way people read device names: runs
// of digits compare by value, so dev-2 sorts before dev-10 and renderD128
// before renderD1024. The SDK, discovery and the CLI share it.
package natural

import (
	"cmp"
	"slices"
	"strings"
)

// Compare orders a and b naturally: runs of digits compare by value (of
// any length, leading zeros aside, fewer zeros first), everything else
// byte by byte.
func Compare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			if c := cmp.Compare(da, db); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if c := cmp.Compare(a[0], b[0]); c != 0 {
			return c
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitsPrefix(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// Sort sorts s naturally.
func Sort(s []string) { slices.SortFunc(s, Compare) }
