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
