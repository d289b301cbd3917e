package output

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	v := map[string]int{"example.com/foo": 8}
	table := func(t *tabwriter.Writer) error {
		_, err := fmt.Fprintln(t, "NAME\tCOUNT\nexample.com/foo\t8")
		return err
	}
	for _, tc := range []struct {
		format, want string
	}{
		{JSON, "{\n  \"example.com/foo\": 8\n}\n"},
		{YAML, "example.com/foo: 8\n"},
		{Table, "NAME             COUNT\nexample.com/foo  8\n"},
	} {
		var b bytes.Buffer
		if err := Write(&b, tc.format, v, table); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("%s:\n%q\nwant\n%q", tc.format, b.String(), tc.want)
		}
	}
	if err := Write(&bytes.Buffer{}, "xml", v, table); err == nil || !strings.Contains(err.Error(), `--output: "xml" is not a format; use table, json or yaml`) {
		t.Errorf("unknown format: %v", err)
	}
}

// TestID checks which device IDs a table quotes: those whose characters
// would garble a table or pass for something else.
func TestID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id, want string }{
		{"dev-0", "dev-0"},
		{"0000:3b:00.0", "0000:3b:00.0"},
		{"GPU-8f3c_é", "GPU-8f3c_é"},
		{"", `""`},
		{"dev-0\n", `"dev-0\n"`},
		{"dev\x1b[31m", `"dev\x1b[31m"`},
		{"a\tb", `"a\tb"`},
		{"MIG-GPU-1/0/0", `"MIG-GPU-1/0/0"`},
		{`..\x`, `"..\\x"`},
		{"a,b", `"a,b"`},
		{"a b", `"a b"`},
		{"a\u00a0b", `"a\u00a0b"`},
		{"\xff", `"\xff"`},
		{`say"hi`, `"say\"hi"`},
	} {
		if got := ID(tc.id); got != tc.want {
			t.Errorf("ID(%q) = %s, want %s", tc.id, got, tc.want)
		}
	}
	if got, want := IDs([]string{"dev-0", "dev/1", "dev-2\r"}), `dev-0,"dev/1","dev-2\r"`; got != want {
		t.Errorf("IDs = %s, want %s", got, want)
	}
}
