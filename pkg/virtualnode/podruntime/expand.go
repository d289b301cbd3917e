package podruntime

import "strings"

// Expand replaces $(VAR) references with the variable's value like the
// kubelet does in command and args; $$ escapes a dollar sign and unknown
// references are kept as they are.
func Expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			out.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			out.WriteByte('$')
			i++
			continue
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end >= 0 {
				name := s[i+2 : i+2+end]
				if v, ok := env[name]; ok {
					out.WriteString(v)
					i += 2 + end
					continue
				}
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}
