package configfile

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	type file struct {
		TypeMeta `json:",inline"`
		Every    Duration `json:"every"`
	}
	var f file
	if err := DecodeStrict([]byte("apiVersion: dpkit.io/v1alpha1\nkind: X\nevery: 1m30s\n"), &f); err != nil {
		t.Fatal(err)
	}
	if f.APIVersion != APIVersion || f.Kind != "X" || f.Every.Duration != 90*time.Second {
		t.Errorf("decoded %+v", f)
	}
	for _, tc := range []struct{ doc, want string }{
		{"evry: 1s\n", `unknown field "evry"`},
		{"every: 5\n", "a duration must be a string"},
		{"every: soon\n", `"soon" is not a duration`},
	} {
		err := DecodeStrict([]byte(tc.doc), &f)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "error unmarshaling") {
			t.Errorf("DecodeStrict(%q) = %v, want a clean error containing %q", tc.doc, err, tc.want)
		}
	}
	out, err := json.Marshal(Duration{Duration: 5 * time.Second})
	if err != nil || string(out) != `"5s"` {
		t.Errorf("Marshal = %s, %v; want \"5s\"", out, err)
	}
}

func TestReadTypeMeta(t *testing.T) {
	t.Parallel()
	tm, err := ReadTypeMeta([]byte("apiVersion: v1\nkind: Pod\nspec: {whatever: 1}\n"))
	if err != nil || tm != (TypeMeta{APIVersion: "v1", Kind: "Pod"}) {
		t.Errorf("ReadTypeMeta = %+v, %v", tm, err)
	}
	if _, err := ReadTypeMeta([]byte("apiVersion: [\n")); err == nil {
		t.Error("ReadTypeMeta accepted broken YAML")
	}
}
