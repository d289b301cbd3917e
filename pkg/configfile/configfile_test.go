package configfile

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// testFile is a configuration file type shaped like dpkit's: TypeMeta
// inline, defaults for unset scalars, nested lists of structs, a map.
type testFile struct {
	TypeMeta `json:",inline"`
	Name     string            `json:"name"`
	Count    int               `json:"count,omitempty"`
	Every    Duration          `json:"every,omitempty"`
	Items    []testItem        `json:"items,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Enabled  *bool             `json:"enabled,omitempty"`
}

type testItem struct {
	ResourceName string `json:"resourceName"`
	Size         int    `json:"size,omitempty"`
}

func (f *testFile) Default() {
	if f.Count == 0 {
		f.Count = 8
	}
	if f.Every.Duration == 0 {
		f.Every.Duration = 10 * time.Second
	}
	for i := range f.Items {
		if f.Items[i].Size == 0 {
			f.Items[i].Size = 1
		}
	}
}

func (f *testFile) Validate() field.ErrorList {
	var errs field.ErrorList
	if f.Name == "" {
		errs = append(errs, field.Required(field.NewPath("name"), "name it"))
	}
	return errs
}

const head = "apiVersion: dpkit.io/v1alpha1\nkind: Test\n"

func TestDecode(t *testing.T) {
	t.Parallel()
	var f testFile
	if err := Decode([]byte(head+"name: a\nevery: 1m30s\nitems:\n- resourceName: x\n- {resourceName: y, size: 3}\nlabels: {a: b}\nenabled: false\n"), "Test", &f); err != nil {
		t.Fatal(err)
	}
	if f.APIVersion != APIVersion || f.Kind != "Test" || f.Every.Duration != 90*time.Second || f.Count != 8 ||
		len(f.Items) != 2 || f.Items[0].Size != 1 || f.Items[1].Size != 3 || f.Labels["a"] != "b" || f.Enabled == nil || *f.Enabled {
		t.Errorf("decoded %+v", f)
	}
	var j testFile
	if err := Decode([]byte(`{"apiVersion":"dpkit.io/v1alpha1","kind":"Test","name":"a","count":2}`), "Test", &j); err != nil || j.Count != 2 {
		t.Errorf("JSON: %+v, %v", j, err)
	}
}

func TestDecodeProblems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		doc  string
		want []string // the problems, in this order
	}{
		{"wrong apiVersion and kind, checked before the rest", "apiVersion: v1\nkind: Pod\nbogus: 1\n", []string{
			`apiVersion: Unsupported value: "v1": supported values: "dpkit.io/v1alpha1"`,
			`kind: Unsupported value: "Pod": supported values: "Test"`,
		}},
		{"no TypeMeta", "name: a\n", []string{
			"apiVersion: Required value: set apiVersion: dpkit.io/v1alpha1",
			"kind: Required value: set kind: Test",
		}},
		{"TypeMeta in the wrong case", "apiversion: dpkit.io/v1alpha1\nkind: Test\n", []string{
			`apiVersion: Required value: set apiVersion: dpkit.io/v1alpha1 (found "apiversion": field names are case-sensitive)`,
		}},
		{"every decode problem at once, in the file's order", head + `name: a
items:
- resourcename: x
  sise: 2
- resourceName: y
  size: big
cout: 3
count: eight
every: soon
labels: [a]
zzz: 1
name: b
`, []string{
			`items[0].resourcename: Not found: unknown field; did you mean "resourceName"? (field names are case-sensitive)`,
			`items[0].sise: Not found: unknown field; did you mean "size"?`,
			`items[1].size: Invalid value: "big": must be a whole number, not a string`,
			`cout: Not found: unknown field; did you mean "count"?`,
			`count: Invalid value: "eight": must be a whole number, not a string`,
			`every: Invalid value: "soon": "soon" is not a duration; use a string such as "5s" or "1m30s"`,
			`labels: Invalid value: must be a mapping (key: value), not a list`,
			"zzz: Not found: unknown field; known fields: apiVersion, kind, name, count, every, items, labels, enabled",
			"name: Duplicate value: given more than once; keep one",
		}},
		{"a scalar for a list", head + "name: a\nitems: x\n", []string{
			`items: Invalid value: "x": must be a list, e.g. [x], not a string`,
		}},
		{"a fraction for a whole number", head + "name: a\ncount: 1.5\n", []string{
			"count: Invalid value: 1.5: must be a whole number, not a number",
		}},
		{"a number for a duration", head + "name: a\nevery: 5\n", []string{
			`every: Invalid value: 5: must be a duration written as a string such as "5s" or "1m30s"`,
		}},
		{"explicit zeros Default would replace, with Validate's problems", head + "count: 0\nevery: 0s\nitems:\n- {resourceName: x, size: 0}\n", []string{
			"count: Invalid value: 0: an explicit zero is not a setting here; leave the field out for the default, 8",
			`every: Invalid value: "0s": an explicit zero is not a setting here; leave the field out for the default, "10s"`,
			"items[0].size: Invalid value: 0: an explicit zero is not a setting here; leave the field out for the default, 1",
			"name: Required value: name it",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var f testFile
			err := Decode([]byte(tc.doc), "Test", &f)
			var p Problems
			if !errors.As(err, &p) {
				t.Fatalf("Decode = %v, want Problems", err)
			}
			var got []string
			for _, e := range p {
				got = append(got, e.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestDecodeNotAConfigFile(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		"apiVersion: [\n": "not valid YAML or JSON: line 1: did not find expected node content",
		"- a\n- b\n":      "the document must be a mapping of fields",
	} {
		var f testFile
		err := Decode([]byte(doc), "Test", &f)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%q) = %v, want %q", doc, err, want)
		}
	}
	if err := Decode(nil, "Test", Object(nil)); err == nil {
		t.Error("Decode into nil succeeded")
	}
}

func TestProblems(t *testing.T) {
	t.Parallel()
	if Join(nil) != nil {
		t.Error("Join(nil) is not nil")
	}
	err := Join(field.ErrorList{field.Required(field.NewPath("a"), "set a"), field.Invalid(field.NewPath("b").Index(0), 3, "too big")})
	want := "2 problem(s):\n  - a: Required value: set a\n  - b[0]: Invalid value: 3: too big"
	if err.Error() != want {
		t.Errorf("message:\n%s\nwant:\n%s", err, want)
	}
	var fe *field.Error
	if !errors.As(err, &fe) || fe.Field != "a" {
		t.Errorf("errors.As finds %v, want the first problem", fe)
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	known := []string{"name", "count", "idPattern", "numaNodes", "resourceName"}
	for key, want := range map[string]string{
		"resourcename": "resourceName", // case first
		"NAME":         "name",
		"cout":         "count",
		"idpatern":     "idPattern",
		"numaNode":     "numaNodes",
		"qty":          "",
		"x":            "",
	} {
		got, ok := suggest(key, known)
		if got != want || ok != (want != "") {
			t.Errorf("suggest(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	out, err := json.Marshal(Duration{Duration: 5 * time.Second})
	if err != nil || string(out) != `"5s"` {
		t.Errorf("Marshal = %s, %v; want \"5s\"", out, err)
	}
}
